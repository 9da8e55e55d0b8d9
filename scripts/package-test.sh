#!/usr/bin/env bash
# The Debian packages, end to end on this machine (as root): build them (scripts/build-packages.sh),
# `dpkg -i` them, check what they installed (user, conffiles, units, man pages, completions,
# check-config, --version), run the installed binaries once (saltgate-minion -> saltgate ->
# saltgate-master, each as the `saltgate` user with its unit's capabilities and a read-only file
# system but for its unit's writable paths, under strace to compare its system calls with
# SystemCallFilter=@system-service and its socket families with RestrictAddressFamilies=), apply the
# Salt formula (scripts/formula-test.sh), then `dpkg --purge` them and check nothing is left but the
# `saltgate` system user, which Debian policy keeps. What each unit line allows: docs/install.md.
#
# Env: PKG_TEST_IP (127.0.3.x base, default 127.0.3), PKG_TEST_LOW_PORT (a port under 1024 that
# the proxy binds through CAP_NET_BIND_SERVICE, default 506), PKG_TEST_ADMIN_PORT (the proxy's
# admin API, default 9505; saltgate refuses port 0 for its binds), PKG_TEST_NO_BUILD=1 (use the
# .deb files already in target/debian), PKG_TEST_KEEP=1 (keep the work directory and logs).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
say() { printf 'package-test (t=%ds): %s\n' "$(( $(date +%s) - t0 ))" "$*"; }
fail() {
    echo "package-test: FAIL: $*" >&2
    for f in "${w:-/nonexistent}"/*.out "${w:-/nonexistent}"/*.err; do
        [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
    done
    exit 1
}
NET=${PKG_TEST_IP:-127.0.3}
LOW=${PKG_TEST_LOW_PORT:-506}
ADMIN=${PKG_TEST_ADMIN_PORT:-9505}
PKGS=(saltgate saltgate-master saltgate-minion)

missing=()
for p in adduser man-db systemd strace keepalived curl util-linux python3; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
dpkg --purge "${PKGS[@]}" >/dev/null 2>&1 || true

say "building the packages"
if [ "${PKG_TEST_NO_BUILD:-}" = 1 ]; then
    ver=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
    debs=$(for p in "${PKGS[@]}"; do ls target/debian/"${p}_${ver}"-*.deb; done)
else
    debs=$(flock /tmp/heavy.lock scripts/build-packages.sh)
fi
[ "$(echo "$debs" | wc -l)" = 3 ] || fail "expected three packages, got: $debs"
echo "$debs" | while read -r d; do ls -l "$d"; done

say "dpkg -i"
# shellcheck disable=SC2086
dpkg -i $debs >/dev/null

say "what the packages installed"
getent passwd saltgate >/dev/null || fail "no saltgate user"
[ "$(stat -c '%U:%G %a' /etc/saltgate/pki/master)" = "saltgate:saltgate 700" ] || fail "pki/master: $(stat -c '%U:%G %a' /etc/saltgate/pki/master)"
[ "$(stat -c '%U:%G %a' /etc/saltgate/pki/minion)" = "saltgate:saltgate 700" ] || fail "pki/minion"
for f in /etc/saltgate/saltgate.yaml /etc/saltgate/master /etc/saltgate/minion; do
    grep -qx "$f" /var/lib/dpkg/info/*.conffiles || fail "$f is not a conffile"
done
units=()
for p in "${PKGS[@]}"; do
    u=$(dpkg -L "$p" | grep "/systemd/system/$p.service$") || fail "$p has no unit"
    units+=("$u")
    dpkg -L "$p" | grep -q "/usr/share/man/man1/$p.1.gz$" || fail "$p has no man page"
    dpkg -L "$p" | grep -q "/usr/share/bash-completion/completions/$p$" || fail "$p has no bash completion"
    dpkg -L "$p" | grep -q "/usr/share/zsh/vendor-completions/_$p$" || fail "$p has no zsh completion"
    bash -c ". /usr/share/bash-completion/completions/$p && complete -p $p" >/dev/null || fail "$p bash completion does not load"
    v=$("$p" --version)
    echo "$v" | grep -Eq "^$p [0-9.]+ \(commit ([0-9a-f]{12}|unknown)\)$" || fail "--version: $v"
    echo "  $v"
done

say "check-config of the packaged files, and of a broken one"
saltgate check-config /etc/saltgate/saltgate.yaml
saltgate-master check-config /etc/saltgate/master
saltgate-minion check-config /etc/saltgate/minion
w=$(mktemp -d /tmp/saltgate-pkgtest.XXXXXX)
pids=()
# strace -o FILE PROG blocks fatal signals: stop the daemon it traces (its child), and strace ends.
stop_daemons() {
    for p in "${pids[@]}"; do
        for c in $(pgrep -P "$p"); do kill "$c" 2>/dev/null || true; done
    done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    stop_daemons
    if [ "${PKG_TEST_KEEP:-}" = 1 ]; then echo "package-test: kept $w" >&2; else rm -rf "$w"; fi
}
trap cleanup EXIT
printf 'masters: []\nlisteners: {request: {bind: 127.0.0.1:0}}\nbogus_key: 1\n' > "$w/bad.yaml"
set +e; saltgate check-config "$w/bad.yaml" 2> "$w/bad.err"; rc=$?; set -e
[ "$rc" = 1 ] && grep -q bogus_key "$w/bad.err" || fail "broken file: rc=$rc $(cat "$w/bad.err")"

say "systemd-analyze verify, and the offline exposure score"
for u in "${units[@]}"; do
    systemd-analyze verify "$u" 2>&1 | tee "$w/verify.log"
    # verify exits 0 with warnings too: any line naming the unit file is a complaint about it.
    if grep -q "$(basename "$u")" "$w/verify.log"; then fail "systemd-analyze verify $u"; fi
    systemd-analyze security --offline=yes --no-pager "$u" 2>/dev/null | tail -n 1 | sed "s|^|  $(basename "$u"): |"
done

say "man pages render"
for p in "${PKGS[@]}"; do
    MANWIDTH=80 man -P cat "$p" 2>/dev/null | grep -q "check-config" || fail "man $p does not render"
done
MANWIDTH=80 man -P cat saltgate-check-config 2>/dev/null | grep -q "exit 0 valid" || fail "man saltgate-check-config"

say "the installed binaries, minion -> saltgate -> master, as the saltgate user in a sandbox"
mkdir -p "$w/master/pki" "$w/master/cache" "$w/master/sock" "$w/minion/pki" "$w/proxy"
chown -R saltgate:saltgate "$w/master" "$w/minion"
chmod 0755 "$w"
sysfilter=$(
    expand() { systemd-analyze syscall-filter "$1" | sed -n 's/^    //p' | sed 's/ *#.*//' | while read -r s; do
        case "$s" in @*) expand "$s" ;; "") ;; *) echo "$s" ;; esac; done; }
    expand @system-service | sort -u)
# $1 name, $2 writable dir ("" = none), $3.. command. The unit's User=/Group=, NoNewPrivileges,
# AmbientCapabilities/CapabilityBoundingSet, and ProtectSystem=strict + ReadWritePaths (a private
# mount namespace with / read-only and $2 writable), under strace.
sandboxed() {
    local name=$1 rw=$2; shift 2
    local caps=(--bounding-set=-all)
    [ "$name" != minion ] && caps=(--inh-caps=+net_bind_service --ambient-caps=+net_bind_service --bounding-set=-all,+net_bind_service)
    strace -f -qq -s 96 -o "$w/$name.trace" \
        unshare --mount --propagation private sh -c '
            rw=$1; shift
            if [ -n "$rw" ]; then mount --bind "$rw" "$rw"; fi
            mount -o remount,bind,ro /
            exec "$@"' sh "$rw" \
        setpriv --reuid=saltgate --regid=saltgate --init-groups --no-new-privs "${caps[@]}" "$@" \
        > "$w/$name.out" 2> "$w/$name.err" &
    pids+=($!)
}
wait_for() { # $1 what, $2 seconds, $3.. a command that succeeds when it is there
    local what=$1 secs=$2; local end=$(( $(date +%s) + secs )); shift 2
    until "$@"; do
        [ "$(date +%s)" -lt "$end" ] || fail "$what not within ${secs}s"
        sleep 0.2
    done
}

cat > "$w/master/master" <<CONF
id: pkgtest-master
interface: $NET.1
publish_port: 0
ret_port: 0
auto_accept: True
pki_dir: $w/master/pki
cachedir: $w/master/cache
sock_dir: $w/master/sock
CONF
sandboxed master "$w/master" saltgate-master -c "$w/master/master" run
wait_for "saltgate-master ready" 60 grep -q "ready ret=" "$w/master.out"
pub=$(grep -o 'publish=[^ ]*' "$w/master.out" | head -n1 | sed 's/.*://')
ret=$(grep -o 'ret=[^ ]*' "$w/master.out" | head -n1 | sed 's/.*://')
# The master announces its publish port to minions: the proxy's publish listener takes the same
# number on its own address. Its request listener takes a port under 1024 (CAP_NET_BIND_SERVICE).
cat > "$w/proxy/saltgate.yaml" <<CONF
masters:
  - name: m1
    host: $NET.1
    publish_port: $pub
    request_port: $ret
listeners:
  publish:
    bind: $NET.2:$pub
  request:
    bind: $NET.2:$LOW
admin:
  bind: $NET.2:$ADMIN
CONF
chmod 0644 "$w/proxy/saltgate.yaml"
sandboxed proxy "" saltgate run --log-format json --config "$w/proxy/saltgate.yaml"
admin=$NET.2:$ADMIN
wait_for "saltgate /healthz" 30 curl -sf "http://$admin/healthz" -o /dev/null

cat > "$w/minion/minion" <<CONF
id: pkgtest-minion
master: $NET.2
master_port: $LOW
pki_dir: $w/minion/pki
CONF
chown saltgate:saltgate "$w/minion/minion"
sandboxed minion "$w/minion" saltgate-minion run --config "$w/minion/minion"
ping() { saltgate-master -c "$w/master/master" publish --timeout 5 --out json pkgtest-minion test.ping > "$w/ping.json" 2>/dev/null \
    && grep -q '"pkgtest-minion"' "$w/ping.json"; }
wait_for "test.ping through the installed saltgate" 60 ping
python3 - "$w/ping.json" <<'PY' || fail "test.ping: $(cat "$w/ping.json")"
import json, sys
text = open(sys.argv[1]).read()
docs = [json.loads(l) for l in text.splitlines() if l.strip()] if not text.lstrip().startswith("{\n") else [json.loads(text)]
flat = json.dumps(docs)
assert '"pkgtest-minion"' in flat and "true" in flat, flat
PY
curl -sf "http://$admin/api/v1/masters" | grep -q '"m1"' || fail "admin API does not list m1"
pids=("${pids[2]}" "${pids[1]}" "${pids[0]}")   # the minion first, the master last
stop_daemons

say "system calls and socket families against the units' filters"
for name in master proxy minion; do
    case $name in proxy) pkg=saltgate ;; *) pkg=saltgate-$name ;; esac
    unit=$(dpkg -L "$pkg" | grep "/systemd/system/$pkg.service$")
    allowed=$(sed -n 's/^RestrictAddressFamilies=//p' "$unit")
    # Only the daemon's own calls: each process from its execve of /usr/bin/saltgate* on, and the
    # threads it clones (not strace's, unshare's, sh's or setpriv's before it).
    python3 - "$w/$name.trace" "$allowed" "$sysfilter" <<'PY' || fail "$name: see above"
import re, sys
trace, allowed, filt = sys.argv[1], set(sys.argv[2].split()), set(sys.argv[3].split())
line_re = re.compile(r"^(\d+) +(?:<\.\.\. )?([a-z0-9_]+)[( ](.*)$")
daemon, used, fams, problems = set(), set(), set(), []
# The lines no sandbox here can apply, checked against what the daemon did instead.
forbidden = {
    "MemoryDenyWriteExecute": lambda c, a: c in ("mmap", "mprotect", "pkey_mprotect") and "PROT_WRITE" in a and "PROT_EXEC" in a,
    "RestrictNamespaces": lambda c, a: c in ("unshare", "setns") or (c.startswith("clone") and "CLONE_NEW" in a),
    "LockPersonality": lambda c, a: c == "personality" and "0xffffffff" not in a,
    "RestrictRealtime": lambda c, a: c in ("sched_setscheduler", "sched_setattr") and ("SCHED_FIFO" in a or "SCHED_RR" in a),
    "ProtectClock": lambda c, a: c in ("clock_settime", "settimeofday", "adjtimex", "clock_adjtime"),
    "ProtectHostname": lambda c, a: c in ("sethostname", "setdomainname"),
    "ProtectKernelModules": lambda c, a: c in ("init_module", "finit_module", "delete_module"),
    "PrivateTmp/ProtectHome/PrivateDevices": lambda c, a: c in ("open", "openat", "creat") and re.search(
        r'"(/tmp/(?!saltgate-pkgtest)|/var/tmp/|/home/|/root/|/dev/(?!null|zero|full|u?random|tty"))', a),
    "ProtectKernelTunables/ProtectControlGroups": lambda c, a: c in ("open", "openat") and re.search(r'"/(proc/sys|sys)/', a) and re.search(r"O_WRONLY|O_RDWR", a),
}

for line in open(trace, errors="replace"):
    m = line_re.match(line)
    if not m:
        continue
    pid, call, rest = m.groups()
    if call == "execve" and '"/usr/bin/saltgate' in rest and not re.search(r"= -1 ", rest):
        daemon.add(pid)
        continue
    if pid not in daemon:
        continue
    used.add(call)
    for what, bad in forbidden.items():
        if bad(call, rest):
            problems.append(f"{what}: {line.strip()[:200]}")
    c = re.search(r"= (\d+)$", rest.strip())
    if call in ("clone", "clone3", "fork", "vfork") and c:
        daemon.add(c.group(1))
    f = re.match(r"(AF_[A-Z0-9]+)", rest)
    if call == "socket" and f:
        fams.add(f.group(1))
if not daemon:
    sys.exit("no execve of /usr/bin/saltgate* in " + trace)
refused = sorted(used - filt)
bad_fams = sorted(fams - allowed)
print(f"  {len(used)} distinct system calls, socket families {sorted(fams)}")
if refused:
    problems.append(f"calls outside @system-service: {refused}")
if bad_fams:
    problems.append(f"socket families outside RestrictAddressFamilies: {bad_fams}")
for p in problems[:20]:
    print("  " + p)
sys.exit(1 if problems else 0)
PY
done

say "the Salt formula with salt-call --local (scripts/formula-test.sh)"
flock /tmp/heavy.lock scripts/formula-test.sh

say "dpkg --purge leaves only the saltgate user"
dpkg --purge "${PKGS[@]}" >/dev/null
for d in /etc/saltgate /var/cache/saltgate /run/saltgate; do
    [ ! -e "$d" ] || fail "$d is left after purge: $(find "$d" | head)"
done
for p in "${PKGS[@]}"; do
    [ ! -e "/usr/bin/$p" ] || fail "/usr/bin/$p is left"
    [ -z "$(find /usr/share/man /usr/share/doc /usr/share/bash-completion /usr/share/zsh /usr/lib/systemd /lib/systemd /etc/systemd -name "$p*" -o -name "_$p" 2>/dev/null)" ] \
        || fail "files of $p left: $(find /usr/share /usr/lib/systemd /lib/systemd /etc/systemd -name "$p*" 2>/dev/null)"
done
getent passwd saltgate >/dev/null || fail "the saltgate user should stay (Debian policy keeps system users)"
say "ok"
