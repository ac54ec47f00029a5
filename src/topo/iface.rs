//! Which local address other hosts can reach this one on.
//!
//! [`pick_address`] chooses by an interface spec in the syntax of `NCCL_SOCKET_IFNAME`, read
//! from [`SOCKET_IFNAME_ENV`] (`FERRO_SOCKET_IFNAME`) by callers:
//!
//! | spec | meaning |
//! |---|---|
//! | `eth` | interfaces whose name starts with `eth` |
//! | `eth0,ib` | names starting with `eth0` or `ib` |
//! | `=eth0` | exactly `eth0` (`=` applies to the whole list) |
//! | `^docker,lo` | every interface except those starting with `docker` or `lo` |
//!
//! Without a spec: the first IPv4 address of an interface that is up and is neither loopback
//! nor `docker*`, else the first such IPv6 address that is not link-local, else `127.0.0.1`.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{Error, Result};

/// The environment variable naming the interfaces to use (syntax in the module docs).
pub const SOCKET_IFNAME_ENV: &str = "FERRO_SOCKET_IFNAME";

/// The addresses of the interfaces that are up, loopback included, in the order the kernel
/// lists them: `(interface name, address)`.
pub fn interface_addresses() -> Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for getifaddrs to store the list's address.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io(
            "listing network interfaces (getifaddrs)",
            &io::Error::last_os_error(),
        ));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) == 0 {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr of at least the family field.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: the family says this sockaddr is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        let name = if ifa.ifa_name.is_null() {
            String::new()
        } else {
            // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
            unsafe { CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned()
        };
        out.push((name, ip));
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once; no reference into
    // the list outlives this point (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The local address to advertise to other hosts, chosen by `ifname_spec` (see the module
/// docs; `None` or empty: the default choice).
pub fn pick_address(ifname_spec: Option<&str>) -> Result<IpAddr> {
    select_address(&interface_addresses()?, ifname_spec, false)
}

/// The choice of [`pick_address`] among `addrs`; with `ipv4_only`, IPv6 addresses are never
/// chosen.
pub(crate) fn select_address(
    addrs: &[(String, IpAddr)],
    ifname_spec: Option<&str>,
    ipv4_only: bool,
) -> Result<IpAddr> {
    let spec = ifname_spec.map(str::trim).filter(|s| !s.is_empty());
    let allowed = |name: &str, ip: &IpAddr| -> bool {
        match spec {
            Some(spec) => spec_matches(spec, name),
            None => !ip.is_loopback() && !name.starts_with("docker") && !name.starts_with("lo"),
        }
    };
    let usable_v6 = |ip: &Ipv6Addr| !ipv4_only && (ip.segments()[0] & 0xffc0) != 0xfe80;
    let v4 = addrs
        .iter()
        .find(|(n, ip)| ip.is_ipv4() && allowed(n, ip))
        .map(|(_, ip)| *ip);
    let v6 = || {
        addrs
            .iter()
            .find(|(n, ip)| matches!(ip, IpAddr::V6(v6) if usable_v6(v6)) && allowed(n, ip))
            .map(|(_, ip)| *ip)
    };
    match (v4.or_else(v6), spec) {
        (Some(ip), _) => Ok(ip),
        (None, None) => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        (None, Some(spec)) => {
            let listed: Vec<String> = addrs.iter().map(|(n, ip)| format!("{n} ({ip})")).collect();
            Err(Error::invalid_argument(format!(
                "{SOCKET_IFNAME_ENV}={spec} matches no {}address of an interface that is up; \
                 interfaces up: {}",
                if ipv4_only { "IPv4 " } else { "" },
                if listed.is_empty() {
                    "none".to_string()
                } else {
                    listed.join(", ")
                }
            )))
        }
    }
}

/// Whether interface `name` is selected by `spec` (syntax in the module docs).
fn spec_matches(spec: &str, name: &str) -> bool {
    let (exclude, rest) = match spec.strip_prefix('^') {
        Some(r) => (true, r),
        None => (false, spec),
    };
    let (exact, list) = match rest.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let hit = list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                name == p
            } else {
                name.starts_with(p)
            }
        });
    hit != exclude
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<(String, IpAddr)> {
        [
            ("lo", "127.0.0.1"),
            ("lo", "::1"),
            ("docker0", "172.17.0.1"),
            ("eth0", "fe80::1"),
            ("eth0", "10.0.0.5"),
            ("eth1", "2001:db8::7"),
            ("ib0", "192.168.9.3"),
        ]
        .iter()
        .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
        .collect()
    }

    #[test]
    fn default_prefers_routable_ipv4() {
        let t = table();
        assert_eq!(
            select_address(&t, None, false).unwrap(),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            select_address(&t, Some("  "), false).unwrap(),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        let only_v6: Vec<_> = t
            .iter()
            .filter(|(n, _)| n == "eth1" || n == "lo")
            .cloned()
            .collect();
        assert_eq!(
            select_address(&only_v6, None, false).unwrap(),
            "2001:db8::7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            select_address(&only_v6, None, true).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(
            select_address(&[], None, false).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn spec_selects_and_excludes() {
        let t = table();
        let pick = |s: &str| select_address(&t, Some(s), false).unwrap().to_string();
        assert_eq!(pick("ib"), "192.168.9.3");
        assert_eq!(pick("eth1"), "2001:db8::7");
        assert_eq!(pick("^eth,lo,docker"), "192.168.9.3");
        assert_eq!(pick("^ib"), "127.0.0.1");
        assert_eq!(pick("=lo"), "127.0.0.1");
        assert_eq!(pick("=eth0"), "10.0.0.5");
        let e = select_address(&t, Some("=eth"), false).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.message().contains("FERRO_SOCKET_IFNAME==eth"), "{e}");
        assert!(e.message().contains("ib0 (192.168.9.3)"), "{e}");
        let e = select_address(&t, Some("eth1"), true).unwrap_err();
        assert!(e.message().contains("IPv4"), "{e}");
    }

    #[test]
    fn this_host_has_a_loopback_address() {
        let addrs = interface_addresses().unwrap();
        assert!(addrs.iter().any(|(_, ip)| ip.is_loopback()), "{addrs:?}");
        // The default choice always yields an address.
        pick_address(None).unwrap();
    }
}
