//! Listener addresses as operators write them: `10.0.0.1:4505`, `[::1]:4505`, `*:4505`, `:4505`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Parses a bind address. `*` and an empty host mean every IPv4 address, as in HAProxy.
pub fn parse_bind(text: &str) -> Result<SocketAddr, String> {
    let t = text.trim();
    if let Ok(sa) = t.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(format!(
                "bind address {text:?}: port 0 is not allowed; name the port minions connect to"
            ));
        }
        return Ok(sa);
    }
    let (host, port) = t.rsplit_once(':').ok_or_else(|| {
        format!("bind address {text:?} has no port; write it as IP:PORT, for example 0.0.0.0:4505")
    })?;
    let port: u16 = port.parse().map_err(|_| {
        format!("bind address {text:?}: port {port:?} is not a number from 1 to 65535")
    })?;
    if port == 0 {
        return Err(format!(
            "bind address {text:?}: port 0 is not allowed; name the port minions connect to"
        ));
    }
    let ip: IpAddr = match host {
        "" | "*" | "0.0.0.0" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        h => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| {
                format!("bind address {text:?}: {h:?} is not an IP address; saltgate binds to IP addresses, not host names")
            })?,
    };
    Ok(SocketAddr::new(ip, port))
}

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port` (`salt1.example.com:4505`, `10.0.0.1`,
/// `[::1]:4505`): the master addresses of HAProxy files and of Salt minion files.
pub fn split_host_port(text: &str) -> Result<(String, Option<u16>), String> {
    let t = text.trim();
    if t.is_empty() || t.contains(char::is_whitespace) {
        return Err(format!("{text:?} is not a host name or address"));
    }
    let port = |p: &str| -> Result<u16, String> {
        if p.starts_with('+') || p.starts_with('-') {
            return Err(format!("{text:?}: port offsets are not supported"));
        }
        match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!(
                "{text:?}: port {p:?} is not a number from 1 to 65535"
            )),
            Ok(p) => Ok(p),
        }
    };
    if let Some(rest) = t.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{text:?}: missing ']' after the IPv6 address"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host.to_string(), Some(port(p)?))),
            None if after.is_empty() => Ok((host.to_string(), None)),
            None => Err(format!("{text:?}: unexpected {after:?} after the address")),
        };
    }
    // A bare IPv6 address has several colons and no port.
    if t.matches(':').count() > 1 {
        return Ok((t.to_string(), None));
    }
    match t.split_once(':') {
        Some((h, p)) if !h.is_empty() => Ok((h.to_string(), Some(port(p)?))),
        Some(_) => Err(format!("{text:?} has no host before the port")),
        None => Ok((t.to_string(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_forms_operators_write_are_understood() {
        assert_eq!(
            parse_bind("10.27.5.116:4505").unwrap().to_string(),
            "10.27.5.116:4505"
        );
        assert_eq!(parse_bind("*:4505").unwrap().to_string(), "0.0.0.0:4505");
        assert_eq!(parse_bind(":4506").unwrap().to_string(), "0.0.0.0:4506");
        assert_eq!(parse_bind("[::1]:4505").unwrap().to_string(), "[::1]:4505");
    }

    #[test]
    fn bad_bind_addresses_explain_themselves() {
        assert!(parse_bind("10.0.0.1").unwrap_err().contains("no port"));
        assert!(parse_bind("10.0.0.1:x")
            .unwrap_err()
            .contains("not a number"));
        assert!(parse_bind("10.0.0.1:0").unwrap_err().contains("port 0"));
        assert!(parse_bind("salt.example.com:4505")
            .unwrap_err()
            .contains("not an IP"));
    }
}
