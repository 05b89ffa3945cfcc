#!/usr/bin/env bash
# The Debian package as a user gets it (issue #33 item 8): built with cargo-deb from the binary
# the tests ran (staged where a release build puts it, so the package is the one `cargo deb -p
# latchkey` makes from a release build), installed with `dpkg -i`, then checked: the system user,
# the conffile and its mode, the unit under `systemd-analyze verify`, and the unit's own
# ExecStart run as its User= with its data dir until the member grants a lock and stops cleanly
# on the unit's KillSignal; then removed (the conffile stays) and purged. Needs root (CI is).
# There is no systemd running here (no PID 1 to `systemctl start` under): the unit's command is
# run by hand as systemd would run it, which is what the package's own test can reach.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo_deb_version=3.8.0
if [[ "$(cargo deb --version 2>/dev/null)" != *"$cargo_deb_version"* ]]; then
    cargo install --locked cargo-deb --version "$cargo_deb_version"
fi
stage=target/deb-check
rm -rf "$stage"
mkdir -p "$stage/release"
cp target/debug/latchkey "$stage/release/latchkey"
CARGO_TARGET_DIR="$stage" cargo deb -p latchkey --no-build --no-strip -o "$stage/" >/dev/null
deb=$(ls "$stage"/latchkey_*.deb)
fail() { echo "check-deb: $*" >&2; exit 1; }
# It installs, runs and purges a package as root, and removes the user it made: only on a
# machine with no latchkey of its own (no package, user, group, binary, config or data dir).
if dpkg -s latchkey >/dev/null 2>&1; then
    fail "a latchkey package is installed already; this check installs and purges its own"
fi
for there in "getent passwd latchkey" "getent group latchkey" "test -e /usr/bin/latchkey" \
    "test -e /etc/latchkey" "test -e /var/lib/latchkey"; do
    if $there >/dev/null 2>&1; then
        fail "this machine has a latchkey of its own ($there): the check would change it; run it on a throwaway machine (CI)"
    fi
done
pid=
cleanup() {
    [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null || true
    dpkg -P latchkey >/dev/null 2>&1 || true
    rm -rf /var/lib/latchkey /etc/latchkey
    getent passwd latchkey >/dev/null && userdel latchkey 2>/dev/null || true
    getent group latchkey >/dev/null && groupdel latchkey 2>/dev/null || true
}
trap cleanup EXIT
dpkg -i "$deb" | sed 's/^/dpkg: /'

getent passwd latchkey | grep -q ':/var/lib/latchkey:/usr/sbin/nologin$' \
    || fail "no system user latchkey with home /var/lib/latchkey: $(getent passwd latchkey)"
[[ "$(stat -c '%U:%G %a' /etc/latchkey/latchkey.toml)" == "root:latchkey 640" ]] \
    || fail "/etc/latchkey/latchkey.toml is $(stat -c '%U:%G %a' /etc/latchkey/latchkey.toml)"
dpkg-query --showformat='${Conffiles}\n' --show latchkey | grep -q '/etc/latchkey/latchkey.toml' \
    || fail "the configuration is not a conffile"
unit=/usr/lib/systemd/system/latchkey.service
[[ -f "$unit" ]] || fail "no unit at $unit"
if command -v systemd-analyze >/dev/null; then
    out=$(systemd-analyze verify "$unit" 2>&1 || true)
    if grep -q latchkey <<<"$out"; then
        fail "systemd-analyze verify: $out"
    fi
fi
# The unit's command, as its user (setpriv execs it: the member is the process signalled, as
# under systemd), in the data dir the package made, on a free port through the LATCHKEY_*
# override its EnvironmentFile= allows.
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
user=$(sed -n 's/^User=//p' "$unit")
[[ "$exec_start" == "/usr/bin/latchkey serve --config /etc/latchkey/latchkey.toml" ]] \
    || fail "unexpected ExecStart: $exec_start"
[[ "$(stat -c '%U:%G %a' /var/lib/latchkey)" == "$user:$user 700" ]] \
    || fail "the data dir is $(stat -c '%U:%G %a' /var/lib/latchkey)"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log="$stage/serve.log"
# shellcheck disable=SC2086 # the unit's command line, split as systemd splits it
LATCHKEY_LISTEN="127.0.0.1:$port" setpriv --reuid "$user" --regid "$user" --init-groups \
    $exec_start >"$log" 2>&1 &
pid=$!
out=$(/usr/bin/latchkey lock --endpoints "127.0.0.1:$port" --timeout 30s deb/check -- sh -c 'echo "token $LATCHKEY_TOKEN"') \
    || fail "no lock from the installed member: $out
$(tail -20 "$log")"
[[ "$out" == token\ * ]] || fail "lock printed: $out"
ls /var/lib/latchkey | grep -q . || fail "the member wrote nothing to /var/lib/latchkey"
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
[[ $status == 0 ]] || fail "the member stopped with $status on SIGTERM: $(tail -20 "$log")"
dpkg -r latchkey >/dev/null
[[ -f /etc/latchkey/latchkey.toml ]] || fail "dpkg -r removed the conffile"
dpkg -P latchkey >/dev/null
[[ ! -e /etc/latchkey/latchkey.toml ]] || fail "dpkg -P left the conffile"
echo "check-deb: $(basename "$deb") installed, served ($out), stopped cleanly, removed and purged"
