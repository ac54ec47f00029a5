//! Choosing `FERRO_STORE_ADDR`: the address and port rank 0 will listen on for the rendezvous
//! store.
//!
//! Here: `127.0.0.1` and a port the kernel hands out for port 0 (released again, so rank 0 can
//! bind it a moment later). In a network namespace: the first IPv4 address of the namespace's
//! first non-loopback interface, and a port found the same way from a thread that has entered
//! that namespace (falling back to a random port in 20000..60000).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::PathBuf;
use std::process::Command;

use ferroccl_transport::{Error, ErrorKind, Result};

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// Ports tried when no port can be probed inside a namespace.
const RANDOM_PORTS: std::ops::Range<u16> = 20000..60000;

/// The file that names network namespace `name`, if it exists.
pub fn netns_path(name: &str) -> Result<PathBuf> {
    NETNS_DIRS
        .iter()
        .map(|dir| PathBuf::from(dir).join(name))
        .find(|path| path.exists())
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "network namespace '{name}' not found (no {}/{name}); \
                 create test hosts with `scripts/netns.sh up N` (as root)",
                NETNS_DIRS[0]
            ))
        })
}

/// The store address for a job whose rank 0 runs in namespace `first_host`, or here if `None`.
pub fn store_addr(first_host: Option<&str>) -> Result<SocketAddr> {
    match first_host {
        None => {
            let ip = Ipv4Addr::LOCALHOST;
            let port = free_port(ip)
                .map_err(|e| Error::io(format!("choosing a store port: bind {ip}:0"), &e))?;
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        Some(name) => {
            let ip = netns_ipv4(name)?;
            let port = free_port_in_netns(name, ip).unwrap_or_else(|_| random_port());
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
    }
}

/// The first IPv4 address on a non-loopback interface of namespace `name`.
pub fn netns_ipv4(name: &str) -> Result<Ipv4Addr> {
    let output = Command::new("ip")
        .args(["-n", name, "-4", "-o", "addr", "show"])
        .output()
        .map_err(|e| Error::io(format!("running `ip -n {name} -4 -o addr show`"), &e))?;
    if !output.status.success() {
        return Err(Error::new(
            ErrorKind::System,
            format!(
                "`ip -n {name} -4 -o addr show` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    parse_first_ipv4(&text).ok_or_else(|| {
        Error::invalid_argument(format!(
            "network namespace '{name}' has no IPv4 address outside loopback \
             (`ip -n {name} -4 -o addr show` printed {:?})",
            text.trim()
        ))
    })
}

/// The first non-loopback IPv4 address in the output of `ip -4 -o addr show`, whose lines look
/// like `2: eth0    inet 10.231.0.1/24 brd 10.231.0.255 scope global eth0\ ...`.
pub fn parse_first_ipv4(ip_output: &str) -> Option<Ipv4Addr> {
    ip_output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let _index = words.next()?;
        let ifname = words.next()?.split('@').next()?;
        if ifname == "lo" {
            return None;
        }
        let mut words = words.skip_while(|w| *w != "inet");
        words.next()?;
        let addr: Ipv4Addr = words.next()?.split('/').next()?.parse().ok()?;
        (!addr.is_loopback()).then_some(addr)
    })
}

/// A port the kernel considers free on `ip` right now (bound to port 0, then released).
fn free_port(ip: Ipv4Addr) -> std::io::Result<u16> {
    let listener = TcpListener::bind(SocketAddrV4::new(ip, 0))?;
    Ok(listener.local_addr()?.port())
}

/// [`free_port`] run from a thread that has entered network namespace `name`.
fn free_port_in_netns(name: &str, ip: Ipv4Addr) -> Result<u16> {
    let path = netns_path(name)?;
    let file = std::fs::File::open(&path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), &e))?;
    // A namespace switch affects only the calling thread, so do it on a thread of its own that
    // ends right after.
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<u16> {
                use std::os::fd::AsRawFd;
                // SAFETY: `file` is an open descriptor for a network namespace file that stays
                // open for the whole call; setns only changes this thread's namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    let err = std::io::Error::last_os_error();
                    return Err(Error::io(format!("setns into {}", path.display()), &err));
                }
                free_port(ip).map_err(|e| {
                    Error::io(
                        format!("choosing a store port in '{name}': bind {ip}:0"),
                        &e,
                    )
                })
            })
            .join()
            .map_err(|_| Error::internal(format!("port probe thread for '{name}' panicked")))?
    })
}

/// A random port in [`RANDOM_PORTS`].
fn random_port() -> u16 {
    // RandomState is seeded from the operating system's random source.
    let random = RandomState::new().build_hasher().finish();
    let span = u64::from(RANDOM_PORTS.end - RANDOM_PORTS.start);
    // The remainder is below `span`, which fits in u16.
    RANDOM_PORTS.start + (random % span) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_output() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                    2: eth0    inet 10.231.0.2/24 scope global eth0\\       valid_lft forever\n\
                    3: eth1    inet 10.9.9.9/16 scope global eth1\\       valid_lft forever\n";
        assert_eq!(parse_first_ipv4(text), Some(Ipv4Addr::new(10, 231, 0, 2)));
        assert_eq!(
            parse_first_ipv4(
                "5: veth0@if4    inet 192.168.7.1/24 brd 192.168.7.255 scope global\n"
            ),
            Some(Ipv4Addr::new(192, 168, 7, 1))
        );
        assert_eq!(
            parse_first_ipv4("1: lo    inet 127.0.0.1/8 scope host lo\n"),
            None
        );
        assert_eq!(parse_first_ipv4(""), None);
        assert_eq!(parse_first_ipv4("2: eth0    inet notanaddr/24\n"), None);
    }

    #[test]
    fn local_store_addr_is_bindable() {
        let addr = store_addr(None).unwrap();
        assert_eq!(addr.ip(), std::net::IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_ne!(addr.port(), 0);
        // Free again right after it was chosen.
        TcpListener::bind(addr).unwrap();
    }

    #[test]
    fn random_ports_in_range() {
        for _ in 0..1000 {
            let p = random_port();
            assert!(RANDOM_PORTS.contains(&p), "{p}");
        }
    }

    #[test]
    fn missing_namespace_is_named() {
        let err = netns_path("ferro-no-such-namespace").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(
            err.message()
                .contains("'ferro-no-such-namespace' not found"),
            "{err}"
        );
    }
}
