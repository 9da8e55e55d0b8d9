//! Grains: facts about this host, named as Salt's core grains name them (`id`, `os`,
//! `os_family`, `kernel`, `host`, `fqdn`, `ipv4`, `num_cpus`, `mem_total` in MiB, `saltversion`,
//! ...). Collected once per process ([`HostGrains::collect`]); a minion's own view adds its id
//! and the config's static `grains`. Reads `/etc/os-release`, `/proc` and the interfaces only.

use saltgate_config::salt_minion::GrainValue;
use saltgate_wire::envelope::{self, text, Value};

/// The Salt release whose wire protocol and grain names we follow.
pub const SALT_VERSION: &str = "3008.5";

/// Host facts shared by every minion of the process.
#[derive(Debug, Clone)]
pub struct HostGrains {
    entries: Vec<(String, Value)>,
}

fn os_release() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for writes of its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// IPv4 addresses of the interfaces (Salt's `ipv4` grain includes 127.0.0.1).
fn ipv4_addrs() -> Vec<String> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list we walk read-only and free once.
    unsafe {
        if libc::getifaddrs(&mut ifap) != 0 {
            return out;
        }
        let mut cur = ifap;
        while !cur.is_null() {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() && i32::from((*addr).sa_family) == libc::AF_INET {
                let sin = &*(addr as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                let s = ip.to_string();
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(ifap);
    }
    out.sort();
    out
}

fn mem_total_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Salt's `os` grain from os-release `ID` (debian → Debian, ubuntu → Ubuntu, ...).
fn os_name(id: &str) -> String {
    match id {
        "rhel" => "RedHat".into(),
        "centos" => "CentOS".into(),
        "opensuse-leap" | "opensuse" => "SUSE".into(),
        "" => "Linux".into(),
        other => {
            let mut c = other.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        }
    }
}

fn os_family(id: &str, like: &str) -> String {
    let all = format!("{id} {like}");
    if all.contains("debian") || all.contains("ubuntu") {
        "Debian".into()
    } else if all.contains("rhel") || all.contains("fedora") || all.contains("centos") {
        "RedHat".into()
    } else if all.contains("suse") {
        "Suse".into()
    } else if all.contains("arch") {
        "Arch".into()
    } else {
        os_name(id)
    }
}

impl HostGrains {
    /// Reads this host's facts.
    pub fn collect() -> Self {
        let rel = os_release();
        let get = |k: &str| {
            rel.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let id = get("ID");
        let host_full = hostname();
        let host = host_full.split('.').next().unwrap_or("").to_owned();
        let ver: Vec<Value> = SALT_VERSION
            .split('.')
            .filter_map(|p| p.parse::<u64>().ok())
            .map(Value::from)
            .collect();
        let ipv4: Vec<Value> = ipv4_addrs().iter().map(|s| text(s)).collect();
        let num_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let entries = vec![
            ("os".into(), text(&os_name(&id))),
            ("os_family".into(), text(&os_family(&id, &get("ID_LIKE")))),
            ("osrelease".into(), text(&get("VERSION_ID"))),
            ("oscodename".into(), text(&get("VERSION_CODENAME"))),
            ("osfullname".into(), text(&get("NAME"))),
            ("kernel".into(), text("Linux")),
            ("kernelrelease".into(), text(&kernel_release())),
            ("cpuarch".into(), text(std::env::consts::ARCH)),
            ("host".into(), text(&host)),
            ("nodename".into(), text(&host_full)),
            ("localhost".into(), text(&host_full)),
            ("fqdn".into(), text(&host_full)),
            (
                "domain".into(),
                text(host_full.split_once('.').map_or("", |x| x.1)),
            ),
            ("ipv4".into(), Value::Array(ipv4)),
            ("num_cpus".into(), Value::from(num_cpus as u64)),
            ("mem_total".into(), Value::from(mem_total_mib())),
            ("saltversion".into(), text(SALT_VERSION)),
            ("saltversioninfo".into(), Value::Array(ver)),
            ("saltgate_minion".into(), text(env!("CARGO_PKG_VERSION"))),
        ];
        HostGrains { entries }
    }

    /// The grains of minion `id`: host facts, then the config's static grains, then `id`.
    pub fn for_minion(&self, id: &str, statics: &[(String, GrainValue)]) -> Value {
        let mut m: Vec<(Value, Value)> = Vec::with_capacity(self.entries.len() + statics.len() + 1);
        m.push((text("id"), text(id)));
        for (k, v) in &self.entries {
            if !statics.iter().any(|(s, _)| s == k) {
                m.push((text(k), v.clone()));
            }
        }
        for (k, v) in statics {
            if k != "id" {
                m.push((text(k), grain_value(v)));
            }
        }
        Value::Map(m)
    }
}

/// A config grain as msgpack.
pub fn grain_value(v: &GrainValue) -> Value {
    match v {
        GrainValue::Null => Value::Nil,
        GrainValue::Bool(b) => Value::Boolean(*b),
        GrainValue::Int(i) => Value::from(*i),
        GrainValue::Float(f) => Value::F64(*f),
        GrainValue::Str(s) => text(s),
        GrainValue::List(l) => Value::Array(l.iter().map(grain_value).collect()),
        GrainValue::Map(m) => {
            Value::Map(m.iter().map(|(k, v)| (text(k), grain_value(v))).collect())
        }
    }
}

/// Salt's `grains.get`: `a:b` walks nested maps (and list indexes); `default` when absent.
pub fn get_path(grains: &Value, key: &str, delimiter: &str, default: Value) -> Value {
    let mut node = grains;
    for part in key.split(delimiter) {
        let next = match node {
            Value::Map(_) => envelope::get(node, part),
            Value::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return default,
        }
    }
    node.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minion_view_has_id_statics_and_host_facts() {
        let h = HostGrains::collect();
        let statics = vec![
            ("role".to_string(), GrainValue::Str("web".into())),
            ("os".to_string(), GrainValue::Str("Custom".into())),
        ];
        let g = h.for_minion("m1", &statics);
        assert_eq!(get_path(&g, "id", ":", Value::Nil), text("m1"));
        assert_eq!(get_path(&g, "role", ":", Value::Nil), text("web"));
        assert_eq!(get_path(&g, "os", ":", Value::Nil), text("Custom"));
        assert_eq!(get_path(&g, "kernel", ":", Value::Nil), text("Linux"));
        assert!(get_path(&g, "num_cpus", ":", Value::Nil).as_u64().unwrap() >= 1);
        assert_eq!(
            get_path(&g, "saltversioninfo:0", ":", Value::Nil),
            Value::from(3008)
        );
        assert_eq!(get_path(&g, "nope", ":", text("d")), text("d"));
    }
}
