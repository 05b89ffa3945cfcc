//! `latchkey snapshot save` and `latchkey snapshot restore`: backup and restore (issue #14
//! item 5). The file format and the restore itself are `latchkey_server::backup`'s; this is
//! the glue.

use std::collections::BTreeMap;

use anyhow::Context;
use latchkey_server::backup::{self, BackupHeader};

use crate::{SnapshotRestoreArgs, SnapshotSaveArgs};

pub async fn save(args: SnapshotSaveArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    // One image per Raft group, in group order.
    let images = client.backup().await?;
    let mut groups = Vec::with_capacity(images.len());
    for image in &images {
        let table_sha256: [u8; 32] =
            image.table_sha256.as_slice().try_into().map_err(|_| {
                anyhow::anyhow!("the server sent a table checksum that is not SHA-256")
            })?;
        let header = BackupHeader {
            applied_index: image.applied_index,
            members: image.members.clone(),
            fingerprint: image.fingerprint.clone(),
            table_bytes: image.table.len() as u64,
            table_sha256,
        };
        groups.push((header, image.table.as_slice()));
    }
    let bytes =
        backup::encode_groups_file(&groups).context("the backup received does not check out")?;
    backup::write_file(&args.file, &bytes)
        .with_context(|| format!("cannot write {}", args.file.display()))?;
    let (first, _) = &groups[0];
    let indexes = groups
        .iter()
        .map(|(h, _)| h.applied_index.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    match groups.len() {
        1 => println!(
            "{}: {} bytes, up to log index {}, from members {}",
            args.file.display(),
            bytes.len(),
            first.applied_index,
            first.members
        ),
        n => println!(
            "{}: {} bytes, {n} Raft groups up to log indexes {indexes}, from members {}",
            args.file.display(),
            bytes.len(),
            first.members
        ),
    }
    Ok(())
}

pub async fn restore(args: SnapshotRestoreArgs) -> anyhow::Result<()> {
    let members: BTreeMap<u64, String> = match args.peers {
        Some(peers) => peers.0,
        None => BTreeMap::from([(args.id, args.listen.to_string())]),
    };
    let restored =
        backup::restore(&args.file, &args.data_dir, args.id, &members, args.replicas).await?;
    println!(
        "{}: member {} restored from {} (taken up to log index {} from members {}): {} sessions, \
         {} held locks; its log starts after index {}. Start it with the same --id and --peers{}.",
        args.data_dir.display(),
        args.id,
        args.file.display(),
        restored.header.applied_index,
        restored.header.members,
        restored.sessions,
        restored.locks,
        restored.index,
        match (restored.groups, restored.replicas) {
            (1, 0) => String::new(),
            (g, 0) => format!(" and --groups {g}"),
            (g, r) => format!(" and --groups {g} --replicas {r}"),
        }
    );
    Ok(())
}
