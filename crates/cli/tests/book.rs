//! The book (`docs/`, built with mdBook) kept true to the code: its two generated pages, the CLI
//! reference (`docs/cli.md`, from the clap definition through `latchkey cli-reference`) and the
//! HTTP API reference (`docs/http-reference.md`, from `docs/openapi.json`), must be what their
//! generators give today; and every link of the book and the README must lead to a file and a
//! heading that exist, since `mdbook build` does not check links itself. A page that differs
//! prints how to regenerate it; `LATCHKEY_UPDATE_BOOK=1` makes this test write it instead.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compares a generated page with the checked-in one (or writes it, under
/// `LATCHKEY_UPDATE_BOOK=1`), naming the command that regenerates it.
fn check_generated(page: &str, generated: &str, regenerate: &str) {
    let path = repo().join(page);
    if std::env::var_os("LATCHKEY_UPDATE_BOOK").is_some() {
        std::fs::write(&path, generated).unwrap_or_else(|e| panic!("{page}: {e}"));
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let line = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "{page} is not what its generator gives today (first difference at line {}): \
             regenerate it with `{regenerate}` and commit it",
            line + 1
        );
    }
}

#[test]
fn the_cli_reference_is_generated_from_clap() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_latchkey"));
    command.arg("cli-reference");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LATCHKEY_") {
            command.env_remove(key);
        }
    }
    let out = command.output().expect("latchkey cli-reference runs");
    assert!(out.status.success(), "latchkey cli-reference: {out:?}");
    let page = String::from_utf8(out.stdout).expect("UTF-8");
    for heading in [
        "## latchkey serve",
        "## latchkey lock",
        "## latchkey cluster add",
    ] {
        assert!(page.contains(heading), "the reference has {heading:?}");
    }
    assert!(
        !page.contains("## latchkey cli-reference"),
        "the generator itself is hidden"
    );
    check_generated(
        "docs/cli.md",
        &page,
        "cargo run -p latchkey -- cli-reference > docs/cli.md (or LATCHKEY_UPDATE_BOOK=1 cargo \
         test -p latchkey --test book)",
    );
}

#[test]
fn the_http_reference_is_generated_from_openapi_json() {
    let path = repo().join("docs/openapi.json");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("docs/openapi.json"))
            .expect("docs/openapi.json is JSON");
    let page = http_reference(&doc);
    for heading in ["## POST /v1/locks/acquire", "### AcquireRequest"] {
        assert!(page.contains(heading), "the reference has {heading:?}");
    }
    check_generated(
        "docs/http-reference.md",
        &page,
        "LATCHKEY_UPDATE_BOOK=1 cargo test -p latchkey --test book",
    );
}

/// One table cell: on one line, with `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A schema's type, in words, with a link for a `$ref`.
fn type_of(schema: &Value) -> String {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.rsplit('/').next().unwrap_or(reference);
        return format!("[{name}](#{})", name.to_lowercase());
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(all) = schema.get(key).and_then(Value::as_array) {
            let joiner = if key == "allOf" { " and " } else { " or " };
            return all.iter().map(type_of).collect::<Vec<_>>().join(joiner);
        }
    }
    let mut kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_owned(),
    };
    if let Some(items) = schema.get("items") {
        kind = format!("array of {}", type_of(items));
    }
    if let Some(format) = schema.get("format").and_then(Value::as_str) {
        kind = format!("{kind} ({format})");
    }
    kind
}

/// A schema's bounds: what a request must keep to be valid.
fn constraints_of(schema: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    for (key, words) in [
        ("minimum", "min"),
        ("maximum", "max"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("default", "default"),
    ] {
        if let Some(value) = schema.get(key) {
            parts.push(format!("{words} {value}"));
        }
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        parts.push(format!("pattern `{pattern}`"));
    }
    parts.join("; ")
}

/// The HTTP API reference page, from the OpenAPI document: its routes, each with its parameters,
/// body and answers, then every schema with its fields. Keys are sorted, so the page does not
/// depend on how the JSON parser orders them.
fn http_reference(doc: &Value) -> String {
    let mut out = String::from(
        "# HTTP API reference\n\n\
         <!-- Generated from docs/openapi.json by crates/cli/tests/book.rs, which fails when it \
         differs: regenerate with `LATCHKEY_UPDATE_BOOK=1 cargo test -p latchkey --test book`. \
         Do not edit by hand. -->\n\n",
    );
    let info = &doc["info"];
    out.push_str(&format!(
        "{} {}, version {}: [openapi.json](openapi.json), also served by a node at \
         `GET /v1/openapi.json`. [HTTP API](http.md) shows how to use it.\n\n{}\n\n",
        str_of(info, "title"),
        str_of(doc, "openapi"),
        str_of(info, "version"),
        str_of(info, "description"),
    ));
    let paths = doc["paths"].as_object().expect("paths");
    let mut routes: Vec<(&String, &String, &Value)> = Vec::new();
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("a path item") {
            if ["get", "post", "put", "delete", "patch", "head"].contains(&method.as_str()) {
                routes.push((path, method, operation));
            }
        }
    }
    routes.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    out.push_str("| route | summary |\n|---|---|\n");
    for (path, method, operation) in &routes {
        let heading = format!("{} {path}", method.to_uppercase());
        out.push_str(&format!(
            "| [`{heading}`](#{}) | {} |\n",
            anchor(&heading),
            cell(str_of(operation, "summary"))
        ));
    }
    out.push('\n');
    for (path, method, operation) in &routes {
        out.push_str(&format!("## {} {path}\n\n", method.to_uppercase()));
        for key in ["summary", "description"] {
            let text = str_of(operation, key);
            if !text.is_empty() {
                out.push_str(&format!("{text}\n\n"));
            }
        }
        if let Some(parameters) = operation.get("parameters").and_then(Value::as_array) {
            out.push_str(
                "| parameter | in | required | type | bounds | description |\n\
                 |---|---|---|---|---|---|\n",
            );
            for parameter in parameters {
                let schema = parameter.get("schema").cloned().unwrap_or(Value::Null);
                out.push_str(&format!(
                    "| `{}` | {} | {} | {} | {} | {} |\n",
                    str_of(parameter, "name"),
                    str_of(parameter, "in"),
                    parameter.get("required").and_then(Value::as_bool) == Some(true),
                    type_of(&schema),
                    cell(&constraints_of(&schema)),
                    cell(str_of(parameter, "description")),
                ));
            }
            out.push('\n');
        }
        if let Some(body) = operation.get("requestBody") {
            let content = body["content"]
                .as_object()
                .expect("a request body's content");
            for (media, media_type) in content {
                out.push_str(&format!(
                    "Request body ({media}): {}\n\n",
                    type_of(&media_type["schema"])
                ));
            }
        }
        let responses = operation["responses"].as_object().expect("responses");
        let mut statuses: Vec<&String> = responses.keys().collect();
        statuses.sort();
        out.push_str("| status | body | meaning |\n|---|---|---|\n");
        for status in statuses {
            let response = &responses[status];
            let body = response
                .get("content")
                .and_then(Value::as_object)
                .map(|content| {
                    content
                        .iter()
                        .map(|(media, media_type)| match media_type.get("schema") {
                            Some(schema) => format!("{} ({media})", type_of(schema)),
                            None => media.clone(),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "| {status} | {body} | {} |\n",
                cell(str_of(response, "description"))
            ));
        }
        out.push('\n');
    }
    out.push_str("## Schemas\n\n");
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let mut names: Vec<&String> = schemas.keys().collect();
    names.sort();
    for name in names {
        let schema = &schemas[name];
        out.push_str(&format!("### {name}\n\n"));
        let description = str_of(schema, "description");
        if !description.is_empty() {
            out.push_str(&format!("{description}\n\n"));
        }
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            out.push_str(&type_of(schema));
            let bounds = constraints_of(schema);
            if !bounds.is_empty() {
                out.push_str(&format!("; {bounds}"));
            }
            out.push_str("\n\n");
            continue;
        };
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut fields: Vec<&String> = properties.keys().collect();
        fields.sort();
        out.push_str("| field | type | required | bounds | description |\n|---|---|---|---|---|\n");
        for field in fields {
            let property = &properties[field];
            out.push_str(&format!(
                "| `{field}` | {} | {} | {} | {} |\n",
                type_of(property),
                required.contains(field.as_str()),
                cell(&constraints_of(property)),
                cell(str_of(property, "description")),
            ));
        }
        if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
            out.push_str("\nNo other fields are accepted.\n");
        }
        out.push('\n');
    }
    if let Some(schemes) = doc["components"]
        .get("securitySchemes")
        .and_then(Value::as_object)
    {
        out.push_str("## Security schemes\n\n");
        let mut names: Vec<&String> = schemes.keys().collect();
        names.sort();
        for name in names {
            let scheme = &schemes[name];
            out.push_str(&format!(
                "- `{name}`: {} {}. {}\n",
                str_of(scheme, "type"),
                str_of(scheme, "scheme"),
                str_of(scheme, "description")
            ));
        }
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// The id mdBook gives a heading: its text in lower case, spaces as `-`, other punctuation but
/// `-` and `_` dropped (mdBook's `normalize_id`), after Markdown's own marks are removed.
fn anchor(heading: &str) -> String {
    let text = strip_links(heading).replace(['`', '*'], "");
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// `[text](target)` as `text`.
fn strip_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(close) if after[close..].contains(')') => {
                out.push_str(&after[..close]);
                let tail = &after[close + 2..];
                rest = &tail[tail.find(')').unwrap() + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A page's lines outside fenced code blocks, with inline code removed.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        lines.push(kept);
    }
    lines
}

/// The ids of a page's headings, as mdBook makes them (a repeated one gets `-1`, `-2`, ...).
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut ids = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let id = anchor(title);
        let mut unique = id.clone();
        let mut n = 1;
        while ids.contains(&unique) {
            unique = format!("{id}-{n}");
            n += 1;
        }
        ids.insert(unique);
    }
    ids
}

/// Every `[text](target)` of a page's prose (not in code), with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in prose_lines(text).iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(close) = tail.find(')') else { break };
            found.push((n + 1, tail[..close].to_owned()));
            rest = &tail[close + 1..];
        }
    }
    found
}

#[test]
fn every_link_of_the_book_and_the_readme_resolves() {
    let docs = repo().join("docs").canonicalize().expect("docs/");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&docs)
        .expect("docs/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    let readme = repo().join("README.md").canonicalize().expect("README.md");
    let mut broken = Vec::new();
    for page in pages.iter().chain([&readme]) {
        let text = std::fs::read_to_string(page).unwrap();
        let in_book = page.starts_with(&docs);
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let at = format!("{}:{line}: {target}", page.display());
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                page.clone()
            } else {
                match page.parent().unwrap().join(file).canonicalize() {
                    Ok(path) => path,
                    Err(_) => {
                        broken.push(format!("{at}: no such file"));
                        continue;
                    }
                }
            };
            if in_book && !resolved.starts_with(&docs) {
                broken.push(format!(
                    "{at}: outside the book (docs/), so broken in its HTML"
                ));
                continue;
            }
            if let Some(fragment) = fragment {
                if resolved.extension().is_some_and(|ext| ext == "md") {
                    let ids = heading_ids(&std::fs::read_to_string(&resolved).unwrap());
                    if !ids.contains(fragment) {
                        broken.push(format!("{at}: no heading with the id {fragment:?}"));
                    }
                }
            }
        }
    }
    // Every page is in the table of contents, and every entry there is a page.
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).expect("docs/SUMMARY.md");
    let listed: BTreeSet<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    for page in &pages {
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        if name != "SUMMARY.md" && !listed.contains(&name) {
            broken.push(format!("{name}: not in docs/SUMMARY.md"));
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
