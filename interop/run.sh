#!/usr/bin/env bash
# saltgate's real-Salt interop and fault suite (issue 3). The one command:
#
#   interop/run.sh
#
# Installs what it needs (Debian haproxy, Salt 3008.5 in a cached venv), builds saltgate (release)
# unless SALTGATE_BIN is given, starts a three-master Salt 3008.5 cluster on 127.0.0.2-4, saltgate on
# 127.0.0.1:4505/4506 (configured by `saltgate import-haproxy` from the HAProxy fixture) and HAProxy on
# 127.0.0.10:4505/4506 (the same fixture, rebound), five salt-minions behind each (and three
# saltgate-minions behind saltgate), each minion dialling from its own 127.0.0.x, and runs the
# scenarios side by side. Exit status 0 only if every scenario passed.
#
# Environment (all optional):
#   SALTGATE_BIN=path      use this saltgate binary instead of `cargo build --release -p saltgate-proxy`
#   SALTGATE_MINION_BIN=path  use this saltgate-minion binary instead of `cargo build --release -p
#                          saltgate-minion` (three of them run behind saltgate: scenario 1, presence)
#   SGM=0                  run no saltgate-minion (and build none)
#   SG_IMPL=haproxy        put a second HAProxy in saltgate's slot (develops/validates the harness
#                          without saltgate); default: saltgate
#   SCENARIOS="1 5 6 2 4 3"  which scenarios to run (1 smoke, 2 master killed, 3 master hung,
#                          4 master restarted, 5 reload under load, 6 drain through the API, 7 a
#                          fourth master joins the cluster (saltgate's discovery; not in the default
#                          list); they always run in the order 1 5 6 2 4 7 3; 4 restarts the master
#                          killed in 2)
#   SG_DRAIN_TIMEOUT=20s   saltgate's global.drain_timeout in the imported config (scenario 6)
#   SG_REBALANCE=true      listeners.publish.rebalance.enabled in the imported config (scenario 4
#                          reports the restarted master's share against rebalance.tolerance)
#   HANG_S=30              how long scenario 3 keeps the master SIGSTOPped
#   RESULTS=path           where to write the markdown table (default interop/results/latest.md;
#                          RESULTS= (empty) writes none outside the run dir)
#   INTEROP_DIR=/tmp/sgi.X run directory (default: a new mktemp -d /tmp/sgi.XXXXXX; keep it short,
#                          Salt moves sock_dir into the shared cachedir when the path is long)
#   FANOUT=1               add a third slot: saltgate with the publish listener in `mode: fanout` on
#                          127.0.0.11 (saltgate's config, binds moved), five more minions; FANOUT=0: none
#   MINION_MULTIPROCESSING=0  Salt minions run jobs in threads (`multiprocessing: False`); 1: Salt's
#                          default, a forked process per job (much more CPU: see harness/common.py)
#   KEEP=1                 keep the run directory (logs, configs) even when everything passed
#   TRANSPORT=tcp          Salt's `tcp` transport (issue 27) instead of ZeroMQ (TRANSPORT=zeromq, the
#                          default): masters and stock minions get `transport: tcp`, saltgate is
#                          configured by `import-haproxy --transport tcp` (its default Salt-aware
#                          probe), HAProxy is unchanged (TCP mode). No saltgate-minions and no
#                          fan-out slot (fan-out is refused for tcp: docs/fanout.md); scenarios
#                          1 2 4 3 by default; results in interop/results/latest-tcp.md
#   TLS=1                  with TRANSPORT=tcp: Salt's `ssl` on the masters (server certificate, a
#                          client certificate required, `worker_pools_enabled: False`: the 3008.5
#                          bug in docs/configuration.md) and the minions (a client certificate,
#                          `ca_certs`, CERT_REQUIRED); a test CA, one server certificate naming
#                          the masters' and both load balancers' addresses and one client
#                          certificate are made with openssl in RUN/tls at each run; saltgate gets
#                          `--ssl-ca-certs RUN/tls/ca.pem` and the client certificate; results in
#                          interop/results/latest-tcp-tls.md
#   SALTGATE_VENV, SALT_VERSION   passed to interop/setup.sh (venv cache location / Salt version)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

T_START=$(date +%s)
SG_IMPL=${SG_IMPL:-saltgate}
FIXTURE=$ROOT/examples/haproxy/salt-master-cluster-loopback.cfg
TRANSPORT=${TRANSPORT:-zeromq}
TLS=${TLS:-0}
case "$TRANSPORT" in
  zeromq)
    [ "$TLS" = 0 ] || die "TLS=1 needs TRANSPORT=tcp (Salt's ssl is for its tcp and ws transports)"
    RESULTS=${RESULTS-$HERE/results/latest.md} ;;
  tcp)
    [ "$TLS" = 0 ] || [ "$TLS" = 1 ] || die "TLS must be 0 or 1 (got '$TLS')"
    [ "${SGM:-0}" = 0 ] || die "SGM=1 is not supported with TRANSPORT=tcp (the tcp run has Salt's minions only)"
    [ "${FANOUT:-0}" = 0 ] || die "FANOUT=1 cannot run with TRANSPORT=tcp: saltgate refuses listeners.publish.mode: fanout on tcp (docs/fanout.md)"
    SGM=0 FANOUT=0
    if [ "$TLS" = 1 ]; then RESULTS=${RESULTS-$HERE/results/latest-tcp-tls.md}
    else RESULTS=${RESULTS-$HERE/results/latest-tcp.md}; fi
    SCENARIOS=${SCENARIOS:-1 2 4 3}
    for sc in $SCENARIOS; do
      case "$sc" in 1|2|3|4) ;; *) die "scenario $sc is not in the tcp run (SCENARIOS from 1 2 3 4)" ;; esac
    done ;;
  *) die "TRANSPORT must be zeromq or tcp (got '$TRANSPORT')" ;;
esac
[ -f "$FIXTURE" ] || die "missing HAProxy fixture $FIXTURE"
[ "$(id -u)" = 0 ] || die "run as root (the minions and masters run as root; the suite binds 127.0.0.x:4505/4506)"

# ---- 1. what it needs --------------------------------------------------------
log "installing/checking haproxy and Salt (interop/setup.sh)"
VENV=$("$HERE/setup.sh" | tail -1)
[ -x "$VENV/bin/salt-master" ] || die "interop/setup.sh did not produce a Salt venv (got '$VENV')"
command -v haproxy >/dev/null || die "haproxy not installed"

[ "$SG_IMPL" = saltgate ] || [ "$SG_IMPL" = haproxy ] || die "SG_IMPL must be saltgate or haproxy"
# one cargo build for whatever is not given (saltgate, saltgate-minion)
BUILD=()
[ "$SG_IMPL" = saltgate ] && [ -z "${SALTGATE_BIN:-}" ] && BUILD+=(-p saltgate-proxy)
[ "${SGM:-1}" != 0 ] && [ -z "${SALTGATE_MINION_BIN:-}" ] && BUILD+=(-p saltgate-minion)
if [ ${#BUILD[@]} -gt 0 ]; then
  log "building (cargo build --release ${BUILD[*]})"
  "$ROOT/scripts/build-deps.sh"
  (cd "$ROOT" && cargo build --release "${BUILD[@]}" >&2)
fi
if [ "$SG_IMPL" = saltgate ]; then
  SALTGATE_BIN=${SALTGATE_BIN:-$ROOT/target/release/saltgate}
  [ -x "$SALTGATE_BIN" ] || die "saltgate binary $SALTGATE_BIN not found"
fi
SGM_ARGS=()
if [ "${SGM:-1}" != 0 ]; then
  SALTGATE_MINION_BIN=${SALTGATE_MINION_BIN:-$ROOT/target/release/saltgate-minion}
  [ -x "$SALTGATE_MINION_BIN" ] || die "saltgate-minion binary $SALTGATE_MINION_BIN not found"
  SGM_ARGS=(--sgm-bin "$SALTGATE_MINION_BIN")
fi

# ---- 2. run directory, and the cleanup that always happens --------------------
if [ -n "${INTEROP_DIR:-}" ]; then RUN=$INTEROP_DIR; mkdir -p "$RUN"; else RUN=$(mktemp -d /tmp/sgi.XXXXXX); fi
RUN=$(cd "$RUN" && pwd)
[ ${#RUN} -le 40 ] || die "INTEROP_DIR $RUN is too long (keep it <= 40 chars: unix socket paths and Salt's sock_dir rule)"
mkdir -p "$RUN/pids" "$RUN/sg" "$RUN/ha"
rc=1
cleanup() {
  trap - EXIT INT TERM
  stop_all "$RUN/pids"
  if [ "$rc" = 0 ] && [ "${KEEP:-0}" != 1 ] && [ -z "${INTEROP_DIR:-}" ]; then
    rm -rf "$RUN"
  else
    log "run directory kept: $RUN"
  fi
  log "total $(($(date +%s) - T_START)) s, exit $rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'rc=130; exit 130' INT
trap 'rc=143; exit 143' TERM

# ---- 3. load balancer configs, both from the same fixture --------------------
IMPORT_ARGS=()
TLS_ARGS=()
if [ "$TRANSPORT" = tcp ]; then
  IMPORT_ARGS=(--transport tcp)
  if [ "$TLS" = 1 ]; then
    command -v openssl >/dev/null || die "TLS=1 needs the openssl command"
    make_test_pki "$RUN/tls" 127.0.0.1 127.0.0.10 127.0.0.2 127.0.0.3 127.0.0.4 ||
      die "could not make the test CA and certificate in $RUN/tls"
    log "test CA and server certificate (IP SANs 127.0.0.1, .10, .2-.4): $RUN/tls"
    IMPORT_ARGS+=(--ssl-ca-certs "$RUN/tls/ca.pem")
    TLS_ARGS=(--tls-dir "$RUN/tls")
  fi
fi
haproxy_variant "$FIXTURE" 127.0.0.10 127.0.0.10 "$RUN/ha/admin.sock" >"$RUN/ha/haproxy.cfg"
haproxy -c -q -f "$RUN/ha/haproxy.cfg" || die "haproxy rejects $RUN/ha/haproxy.cfg"
if [ "$SG_IMPL" = saltgate ]; then
  "$SALTGATE_BIN" import-haproxy "${IMPORT_ARGS[@]}" "$FIXTURE" >"$RUN/sg/saltgate.yaml" ||
    die "saltgate import-haproxy $FIXTURE failed"
  # scenario 6 (drain through the API) waits for the drain deadline: keep it short
  sed -i -E "s/^([[:space:]]*drain_timeout:)[[:space:]]*[^[:space:]#]+/\1 ${SG_DRAIN_TIMEOUT:-20s}/" "$RUN/sg/saltgate.yaml"
  grep -qE "^[[:space:]]*drain_timeout: ${SG_DRAIN_TIMEOUT:-20s}\b" "$RUN/sg/saltgate.yaml" ||
    die "could not set global.drain_timeout in $RUN/sg/saltgate.yaml"
  # scenario 4 judges the rebalancing after a restart: set it explicitly (the import's default is on)
  sed -i -E "/^    rebalance:/,/^      delay:/ s/^(      enabled:).*/\1 ${SG_REBALANCE:-true}/" "$RUN/sg/saltgate.yaml"
  grep -qE "^      enabled: ${SG_REBALANCE:-true}\b" "$RUN/sg/saltgate.yaml" ||
    die "could not set listeners.publish.rebalance.enabled in $RUN/sg/saltgate.yaml"
  # scenario 7 (a master joins the cluster): discovery on the cluster's key directory from the start,
  # so the new master is found without any edit to this file (harness/cluster.py: shared/pki)
  if [[ " ${SCENARIOS:-} " == *" 7 "* ]]; then
    printf 'discovery:\n  cluster_pki_dir: %s\n' "$RUN/shared/pki" >>"$RUN/sg/saltgate.yaml"
  fi
  if [ "$TLS" = 1 ]; then
    # the masters require a client certificate (Salt's default; 3008.5's tcp publish server needs
    # one anyway): saltgate's checks present the test client certificate (docs/configuration.md:
    # "For a client certificate, add certfile/keyfile to its output")
    sed -i -E "/^ssl:/,/^[^ ]/ s#^(  cert_reqs: CERT_REQUIRED)\$#\1\n  certfile: $RUN/tls/client.pem\n  keyfile: $RUN/tls/client.key#" \
      "$RUN/sg/saltgate.yaml"
    grep -qE "^  keyfile: $RUN/tls/client.key\$" "$RUN/sg/saltgate.yaml" ||
      die "could not add the client certificate to ssl: in $RUN/sg/saltgate.yaml"
  fi
  "$SALTGATE_BIN" check-config "$RUN/sg/saltgate.yaml" >&2 ||
    die "saltgate check-config rejects its own import of $FIXTURE (see $RUN/sg/saltgate.yaml)"
  log "saltgate config (imported from $(basename "$FIXTURE")): $RUN/sg/saltgate.yaml"
  SG_ARGS=(--sg-bin "$SALTGATE_BIN" --sg-config "$RUN/sg/saltgate.yaml")
else
  # development stand-in: HAProxy from the unchanged fixture in saltgate's slot
  haproxy_variant "$FIXTURE" 127.0.0.1 127.0.0.1 "$RUN/sg/admin.sock" >"$RUN/sg/haproxy.cfg"
  SG_ARGS=(--sg-haproxy "$RUN/sg/haproxy.cfg")
  log "SG_IMPL=haproxy: HAProxy stands in for saltgate on 127.0.0.1"
fi

# ---- 4. the scenarios -------------------------------------------------------
set +e
"$VENV/bin/python" "$HERE/suite.py" --run "$RUN" --venv "$VENV" --fixture "$FIXTURE" \
  --ha-config "$RUN/ha/haproxy.cfg" "${SG_ARGS[@]}" "${SGM_ARGS[@]}" \
  --transport "$TRANSPORT" "${TLS_ARGS[@]}" \
  --scenarios "${SCENARIOS:-1 5 6 2 4 3}" --hang "${HANG_S:-30}" --fanout "${FANOUT:-1}" \
  --results "$RUN/results.md"
rc=$?
set -e
if [ -n "$RESULTS" ] && [ -s "$RUN/results.md" ]; then
  mkdir -p "$(dirname "$RESULTS")"
  # The HA run's section (bench/tests/ha_keepalived/, its figures copied in by hand) stays.
  ha=""
  [ -f "$RESULTS" ] && ha=$(sed -n '/^## Two nodes under keepalived/,$p' "$RESULTS")
  cp "$RUN/results.md" "$RESULTS"
  [ -z "$ha" ] || printf '\n%s\n' "$ha" >> "$RESULTS"
  log "results table: $RESULTS"
fi
