#!/usr/bin/env bash
# The container image as a user gets it (issue #33 item 8): packaging/Containerfile built with
# Debian's podman (buildah inside it) and run, then checked: the image's user, entrypoint,
# command, stop signal, ports and volume; its default command serves a member that grants a
# lock to the CLI inside the container; `podman stop` (SIGTERM) stops it cleanly (exit 0, before
# the SIGKILL timeout); started again on the same volume, the member kept its state (the next
# grant's fencing token is higher). Needs root (CI is).
#
# What differs from a user's `docker build -f packaging/Containerfile .`, and why:
# - No registry is reachable from CI, so the base image is a Debian bookworm this script makes
#   with debootstrap (`--variant=minbase`, the package set `debian:bookworm-slim` is made from)
#   and imports; the Containerfile takes it as `--build-arg DEBIAN_IMAGE`.
# - The binary is the one the tests built (`--build-arg BINARY=prebuilt`), not a release build
#   in `rust:1-bookworm`: that stage is the README's `cargo build --release --locked`, which
#   would take most of CI's time again, and its base image is not reachable either.
# - podman's defaults do not run in this sandbox: crun refuses its hybrid cgroup layout (runc
#   runs it), and the container's default ulimits are above the sandbox's hard limits (which
#   root may not raise here). A containers.conf of this script's own sets both; RUN steps use
#   `--isolation chroot`. Nothing of the machine's podman configuration is changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${LATCHKEY_BIN:-target/debug/latchkey}
bin=$(realpath --relative-to=. "$bin")
[[ -x "$bin" ]] || { echo "check-container: no binary at $bin (build it first)" >&2; exit 1; }
missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi

fail() { echo "check-container: $*" >&2; exit 1; }
work=$(mktemp -d)
tag=$$
base=localhost/latchkey-check-base:$tag
image=localhost/latchkey-check:$tag
ctr=latchkey-check-$tag
volume=latchkey-check-$tag
cat > "$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
export CONTAINERS_CONF="$work/containers.conf"
cleanup() {
    podman rm -f -t 0 "$ctr" >/dev/null 2>&1 || true
    podman volume rm -f "$volume" >/dev/null 2>&1 || true
    podman rmi -f "$image" "$base" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "check-container: base image (debootstrap bookworm minbase)"
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
debootstrap --variant=minbase bookworm "$work/rootfs" "${mirror:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; fail "debootstrap failed"; }
tar -C "$work/rootfs" -c . | podman import --quiet - "$base" >/dev/null
rm -rf "$work/rootfs"

echo "check-container: podman build -f packaging/Containerfile (binary $bin)"
podman build --quiet --isolation chroot -f packaging/Containerfile \
    --build-arg DEBIAN_IMAGE="$base" --build-arg BINARY=prebuilt --build-arg PREBUILT="$bin" \
    -t "$image" . >/dev/null

inspect() { podman image inspect --format "$1" "$image"; }
[[ "$(inspect '{{.Config.User}}')" == latchkey ]] || fail "image user: $(inspect '{{.Config.User}}')"
[[ "$(inspect '{{json .Config.Entrypoint}}')" == '["/usr/local/bin/latchkey"]' ]] ||
    fail "entrypoint: $(inspect '{{json .Config.Entrypoint}}')"
[[ "$(inspect '{{json .Config.Cmd}}')" == '["serve","--listen","0.0.0.0:7420","--metrics-listen","0.0.0.0:9420","--data-dir","/var/lib/latchkey"]' ]] ||
    fail "command: $(inspect '{{json .Config.Cmd}}')"
[[ "$(inspect '{{.Config.StopSignal}}')" == SIGTERM ]] || fail "stop signal: $(inspect '{{.Config.StopSignal}}')"
for port in 7420/tcp 9420/tcp; do
    [[ "$(inspect '{{json .Config.ExposedPorts}}')" == *"\"$port\""* ]] || fail "port $port not exposed"
done
[[ "$(inspect '{{json .Config.Volumes}}')" == *'"/var/lib/latchkey"'* ]] || fail "no volume at /var/lib/latchkey"

# The image's own command, unchanged, on a network of the container's own (loopback only): the
# CLI inside the container reaches it on 127.0.0.1:7420.
podman run --detach --quiet --name "$ctr" --network none -v "$volume:/var/lib/latchkey" "$image" >/dev/null
in_ctr() { podman exec "$ctr" "$@"; }
[[ "$(in_ctr id -un):$(in_ctr id -u)" == latchkey:7420 ]] || fail "runs as $(in_ctr id -un):$(in_ctr id -u)"
lock_token() {
    # Bounded: about 30 s for the member to elect itself after a (re)start.
    local out
    for _ in $(seq 60); do
        if out=$(in_ctr latchkey lock --endpoints 127.0.0.1:7420 --timeout 2s container-check -- \
            sh -c 'echo "token=$LATCHKEY_TOKEN"' 2>&1); then
            sed -n 's/^token=\([0-9][0-9]*\)$/\1/p' <<<"$out"
            return
        fi
        sleep 0.5
    done
    podman logs "$ctr" | tail -20 >&2
    fail "no lock granted in the container: $out"
}
first=$(lock_token)
[[ -n "$first" ]] || fail "no token printed"
echo "check-container: the image's command granted a lock (token $first) as latchkey:7420"

stop_and_check() {
    local started=$SECONDS
    podman stop --time 20 "$ctr" >/dev/null
    local code
    code=$(podman inspect --format '{{.State.ExitCode}}' "$ctr")
    [[ "$code" == 0 ]] || { podman logs "$ctr" | tail -20 >&2; fail "stopped with exit code $code (137 is SIGKILL after the timeout)"; }
    echo "check-container: podman stop (SIGTERM): exit 0 in $((SECONDS - started)) s"
}
stop_and_check
podman start "$ctr" >/dev/null
second=$(lock_token)
((second > first)) || fail "after a restart on the same volume the token went from $first to $second"
echo "check-container: restarted on its volume: next token $second > $first"
stop_and_check
mount=$(podman volume inspect --format '{{.Mountpoint}}' "$volume")
[[ -d "$mount/raft-log" ]] || fail "no raft-log in the volume ($mount)"
[[ "$(stat -c %u "$mount/raft-log")" == 7420 ]] || fail "the volume's data is owned by uid $(stat -c %u "$mount/raft-log")"
echo "check-container: ok"
