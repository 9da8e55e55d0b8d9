"""saltgate's presence (issue 10 part 4, docs/presence.md) checked against the suite's own minions:
every minion behind saltgate (Salt's sg-minions and the saltgate-minions) must be listed by
GET /api/v1/minions, connected, from its own source address (common.minion_source), paired
`by-address` with a publish master, with a request master; no minion behind HAProxy may be listed.
The publish masters are checked against the masters' own sockets: per master, the minions listed
on it must equal saltgate's publish sessions that `ss` shows there (each minion holds one)."""
from .common import MASTERS, log, minion_source, wait_for
from .lb import spread_txt


def _listing(sg):
    """{minion id: entry} from /api/v1/minions; None when the API does not answer 200"""
    try:
        st, body = sg.api("GET", "/api/v1/minions?limit=10000")
    except OSError as exc:
        log(f"presence: /api/v1/minions: {exc}")
        return None
    if st != 200 or not isinstance(body, dict):
        log(f"presence: /api/v1/minions answered {st}: {str(body)[:200]}")
        return None
    return {m["id"]: m for m in body.get("minions", [])}


def _problems(s, listed):
    """what is wrong with LISTED for the suite's minions: [str]"""
    names = set(s.sg.names.values())
    bad = []
    for mid in s.sg.minions + s.sgm_minions:
        m = listed.get(mid)
        if m is None:
            bad.append(f"{mid} not listed")
            continue
        ip = m.get("client", "").rsplit(":", 1)[0]
        if not m.get("connected"):
            bad.append(f"{mid} not connected")
        if ip != minion_source(mid):
            bad.append(f"{mid} client {m.get('client')} (its source address is {minion_source(mid)})")
        if m.get("publish_pairing") != "by-address" or m.get("publish_master") not in names:
            bad.append(f"{mid} publish {m.get('publish_master')} ({m.get('publish_pairing')}, "
                       f"candidates {m.get('publish_candidates')})")
        if m.get("request_master") not in names:
            bad.append(f"{mid} request master {m.get('request_master')}")
    bad += [f"{mid} (behind HAProxy) listed" for mid in s.ha.minions if mid in listed]
    return bad


def _per_master(s, listed):
    """{master ip: minions whose publish_master it is}"""
    ipof = {v: k for k, v in s.sg.names.items()}
    out = {ip: 0 for ip in MASTERS}
    for mid in s.sg.minions + s.sgm_minions:
        ip = ipof.get((listed.get(mid) or {}).get("publish_master"))
        if ip:
            out[ip] += 1
    return out


def _by_address(s, when, timeout):
    """Under TLS (Salt's `ssl` on the tcp transport) presence is by address only (docs/presence.md):
    no id can be read from an encrypted request stream, so /api/v1/minions must list nobody, and
    what saltgate knows is each session's client address: every minion behind saltgate must hold a
    publish session from its own source address in /api/v1/sessions."""
    state = {}

    def good():
        listed = _listing(s.sg)
        try:
            st, body = s.sg.api("GET", "/api/v1/sessions?listener=publish&limit=10000")
        except OSError as exc:
            st, body = 0, str(exc)
        if listed is None or st != 200 or not isinstance(body, dict):
            state.update(bad=[f"admin API: minions {'not ' if listed is None else ''}200, sessions {st}"])
            return False
        clients = {x.get("client", "").rsplit(":", 1)[0] for x in body.get("sessions", [])}
        bad = [f"{mid} listed" for mid in listed]
        bad += [f"no publish session from {mid}'s address {minion_source(mid)}" for mid in s.sg.minions
                if minion_source(mid) not in clients]
        state.update(bad=bad, n=len(body.get("sessions", [])))
        return not bad
    if not wait_for(good, timeout, 1.0):
        return False, f"presence ({when}, TLS: by address only): wrong after {timeout} s: {'; '.join(state['bad'][:8])}"
    return True, (f"presence ({when}, TLS: by address only, docs/presence.md): /api/v1/minions lists no minion "
                  f"(no id is readable under TLS); /api/v1/sessions shows a publish session from each of the "
                  f"{len(s.sg.minions)} minions' own addresses ({state['n']} publish sessions)")


def check(s, when, timeout=30):
    """(ok, note): the listing is right and its publish masters match `ss`, within TIMEOUT seconds
    (a minion that has just moved or reconnected may not be identified yet)"""
    if s.sg.kind != "saltgate":
        return True, f"presence ({when}): not checked (HAProxy in saltgate's slot)"
    if s.cluster.tls_dir:
        return _by_address(s, when, timeout)
    state = {}

    def good():
        listed = _listing(s.sg)
        if listed is None:
            state.update(bad=["/api/v1/minions did not answer 200"], listed={}, per={}, ss={})
            return False
        per, ss = _per_master(s, listed), s.spread()["sg"]
        bad = _problems(s, listed)
        if per != ss:
            bad.append(f"publish masters per master {spread_txt(per)} but ss shows saltgate's publish "
                       f"sessions {spread_txt(ss)}")
        state.update(bad=bad, listed=listed, per=per, ss=ss)
        return not bad
    ok = wait_for(good, timeout, 1.0)
    listed = state["listed"]
    n = len(s.sg.minions) + len(s.sgm_minions)
    if not ok:
        return False, f"presence ({when}): /api/v1/minions is wrong after {timeout} s: {'; '.join(state['bad'][:8])}"
    who = ", ".join(f"{mid} {listed[mid]['client'].rsplit(':', 1)[0]} {listed[mid]['publish_master']}/"
                    f"{listed[mid]['request_master']}" for mid in s.sg.minions + s.sgm_minions)
    return True, (f"presence ({when}): /api/v1/minions lists all {n} minions behind saltgate, each from its own "
                  f"address, connected, publish master paired by-address / request master: {who}; publish "
                  f"masters per master {spread_txt(state['per'])} = saltgate's publish sessions in ss; none of "
                  f"HAProxy's minions listed")
