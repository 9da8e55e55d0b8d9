#!/usr/bin/env bash
# Tests formula/saltgate with the real `salt-call --local` of Salt 3008.5 (the project's venv)
# against a temporary root, file_roots = formula/ and a temporary pillar: no master.
#
# Needs the saltgate package installed (scripts/package-test.sh runs this between `dpkg -i` and
# `dpkg --purge`): `pkg.installed` then runs for real and finds it installed, and check_cmd is the
# installed `saltgate check-config`. Nothing is stubbed; the file goes to a temporary path
# (saltgate:lookup:config_file) instead of /etc/saltgate. The service states (saltgate.service,
# keepalived's service.running) are rendered and compiled (state.show_sls) but not applied: there
# is no systemd as PID 1 here. keepalived's configuration is applied for real to a temporary path
# and checked by `keepalived --config-test`.
#
# Checks: the first apply changes the file; the second changes nothing; the file equals the pillar
# once both are parsed as YAML; a pillar that makes an invalid configuration fails and leaves the
# previous file byte for byte; an empty pillar fails with a message; keepalived's file is valid.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SALT_VENV:-/root/.cache/saltgate/venv-salt-3008.5}
PY="$VENV/bin/python3"
SALT_CALL="$VENV/bin/salt-call"
[ -x "$SALT_CALL" ] || { echo "formula-test: no salt-call in $VENV (interop/setup.sh installs it)" >&2; exit 1; }
dpkg -s saltgate >/dev/null 2>&1 || { echo "formula-test: install the saltgate package first (scripts/package-test.sh)" >&2; exit 1; }

work=$(mktemp -d /tmp/saltgate-formula.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/conf" "$work/root" "$work/pillar" "$work/out"
cat > "$work/conf/minion" <<CONF
id: saltgate-formula-test
file_client: local
root_dir: $work/root
file_roots:
  base:
    - $PWD/formula
pillar_roots:
  base:
    - $work/pillar
log_level_logfile: warning
CONF
printf "base:\n  '*':\n    - saltgate\n" > "$work/pillar/top.sls"
out="$work/out/saltgate.yaml"
ka="$work/out/keepalived.conf"

# $1: the pillar's saltgate:config body (indented 4), $2: extra pillar lines under saltgate:.
pillar() {
    { printf 'saltgate:\n  lookup:\n    config_file: %s\n' "$out"
      printf '    keepalived:\n      config_file: %s\n' "$ka"
      printf '  config:\n%s\n' "$1"
      printf '%s\n' "${2:-}"; } > "$work/pillar/saltgate.sls"
}
VALID='    global:
      shutdown_grace: 20s
    health:
      rise: 2
      fall: 3
    masters:
      - name: m1
        host: 127.0.0.2
      - name: m2
        host: 127.0.0.3
    listeners:
      publish:
        bind: 127.0.0.1:14505
      request:
        bind: 127.0.0.1:14506
    admin:
      bind: 127.0.0.1:19505'
# Valid YAML, invalid configuration: no master, and a request bind that is not an address.
INVALID='    masters: []
    listeners:
      request:
        bind: not-an-address'

call() { "$SALT_CALL" --local --config-dir "$work/conf" --retcode-passthrough --out json "$@"; }
# Prints "<failed> <changed>" for a state run's JSON on stdin.
summary() {
    "$PY" -c 'import json,sys
r=json.load(sys.stdin)["local"]
if not isinstance(r, dict): print("1 0"); sys.exit()
print(sum(1 for s in r.values() if not s["result"]), sum(1 for s in r.values() if s["changes"]))'
}
fail() { echo "formula-test: FAIL: $*" >&2; exit 1; }

echo "formula-test: 1. first apply of saltgate.config changes the file"
pillar "$VALID"
call state.apply saltgate.config > "$work/run1.json" || fail "first apply: $(cat "$work/run1.json")"
read -r failed changed < <(summary < "$work/run1.json")
[ "$failed" = 0 ] && [ "$changed" -ge 1 ] || fail "first apply: failed=$failed changed=$changed"
[ -f "$out" ] || fail "no $out"
[ "$(stat -c '%U:%G %a' "$out")" = "root:saltgate 640" ] || fail "owner/mode $(stat -c '%U:%G %a' "$out")"

echo "formula-test: 2. second apply changes nothing"
call state.apply saltgate.config > "$work/run2.json" || fail "second apply: $(cat "$work/run2.json")"
read -r failed changed < <(summary < "$work/run2.json")
[ "$failed" = 0 ] && [ "$changed" = 0 ] || fail "second apply: failed=$failed changed=$changed: $(cat "$work/run2.json")"

echo "formula-test: 3. the file is the pillar, once both are parsed as YAML; saltgate accepts it"
"$PY" - "$out" "$work/pillar/saltgate.sls" <<'PYEOF' || fail "rendered file differs from the pillar"
import sys, yaml
rendered = yaml.safe_load(open(sys.argv[1]))
pillar = yaml.safe_load(open(sys.argv[2]))["saltgate"]["config"]
if rendered != pillar:
    print("rendered:", rendered, "\npillar:  ", pillar, file=sys.stderr)
    sys.exit(1)
PYEOF
saltgate check-config "$out" 2>/dev/null || fail "saltgate check-config $out"

echo "formula-test: 4. an invalid configuration fails and leaves the previous file"
before=$(sha256sum < "$out")
pillar "$INVALID"
if call state.apply saltgate.config > "$work/run3.json"; then fail "invalid pillar applied: $(cat "$work/run3.json")"; fi
read -r failed changed < <(summary < "$work/run3.json")
[ "$failed" -ge 1 ] && [ "$changed" = 0 ] || fail "invalid pillar: failed=$failed changed=$changed"
grep -q "check_cmd" "$work/run3.json" || fail "the failure does not name check_cmd: $(cat "$work/run3.json")"
[ "$(sha256sum < "$out")" = "$before" ] || fail "the invalid pillar changed $out"

echo "formula-test: 5. an empty saltgate:config fails and says so"
printf 'saltgate:\n  lookup:\n    config_file: %s\n' "$out" > "$work/pillar/saltgate.sls"
if call state.apply saltgate.config > "$work/run4.json"; then fail "empty pillar applied"; fi
grep -q "saltgate:config is empty" "$work/run4.json" || fail "no message: $(cat "$work/run4.json")"

echo "formula-test: 6. saltgate.service and saltgate.keepalived render; keepalived's file passes keepalived -t"
# keepalived -t refuses a loopback interface for VRRP: name one of this host's others (the check
# only reads the configuration; nothing is sent).
iface=$(ip -o link show up 2>/dev/null | awk -F': ' '$2 != "lo" {print $2; exit}' | cut -d@ -f1)
[ -n "$iface" ] || iface=$(ip -o link show 2>/dev/null | awk -F': ' '$2 != "lo" {print $2; exit}' | cut -d@ -f1)
[ -n "$iface" ] || fail "no network interface but lo for keepalived's configuration check"
pillar "$VALID" "  keepalived:
    interface: $iface
    virtual_router_id: 77
    priority: 150
    auth_pass: formulat
    unicast_src_ip: 127.0.0.1
    unicast_peers:
      - 127.0.0.9
    vips:
      - 127.0.0.100/32"
call state.show_sls saltgate.service > "$work/show1.json" || fail "saltgate.service: $(cat "$work/show1.json")"
"$PY" - "$work/show1.json" <<'PYEOF' || fail "saltgate.service does not run and reload on the config file"
import json, sys
s = json.load(open(sys.argv[1]))["local"]["saltgate-service-running"]["service"]
flat = {k: v for d in s if isinstance(d, dict) for k, v in d.items()}
assert "running" in s and flat["reload"] is True and flat["enable"] is True, s
assert {"file": "saltgate-config-file-managed"} in flat["watch"], s
PYEOF
call state.show_sls saltgate.keepalived > "$work/show2.json" || fail "saltgate.keepalived: $(cat "$work/show2.json")"
call state.sls_id saltgate-keepalived-config-file-managed saltgate.keepalived > "$work/run5.json" \
    || fail "keepalived config: $(cat "$work/run5.json")"
grep -q "ctl --admin 127.0.0.1:9505 ready" "$ka" || fail "no track_script in $ka"
grep -q "127.0.0.100/32" "$ka" || fail "no VIP in $ka"
echo "formula-test: ok"
