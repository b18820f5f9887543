//! Three simulated hosts for the demo and `bench e2e`: three network namespaces joined by
//! veth links (as root), or three loopback addresses (otherwise). Processes enter a host with
//! `ip netns exec`; threads of one process with [`Host::enter`].
//!
//! With namespaces, the sequencer host has one link to each application host:
//!
//! ```text
//!   h1 10.77.1.2 ── veth ── 10.77.1.1  seq  10.77.2.1 ── veth ── 10.77.2.2 h2
//! ```
//!
//! On loopback, the sequencer host is 127.0.0.1 and the application hosts 127.0.0.2 and
//! 127.0.0.3 (Linux routes all of 127/8 to `lo`); a TCP client's source address is then
//! 127.0.0.1 whatever host it plays, which the replication allow-lists account for.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Which hosts to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkKind {
    /// Namespaces when run as root and `ip netns` works, loopback otherwise.
    Auto,
    /// Network namespaces joined by veth links (root).
    Netns,
    /// Loopback addresses 127.0.0.1-3.
    Loopback,
}

/// Whether this process runs as root (namespaces need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// One simulated host.
#[derive(Debug, Clone)]
pub struct Host {
    /// `seq`, `h1` or `h2`.
    pub name: &'static str,
    /// Its namespace, when namespaces are used.
    pub netns: Option<String>,
    /// The address its processes bind to.
    pub ip: IpAddr,
}

/// The three hosts, and how the sequencer host is reached from each application host.
pub struct Network {
    /// The sequencer host.
    pub seq: Host,
    /// Application host 1 (algo).
    pub h1: Host,
    /// Application host 2 (OMS, feed handler).
    pub h2: Host,
    /// The sequencer host's address on h1's link.
    pub seq_from_h1: IpAddr,
    /// The sequencer host's address on h2's link.
    pub seq_from_h2: IpAddr,
    namespaces: Vec<String>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip(8)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

impl Host {
    /// Runs `f` on a thread inside this host's namespace and returns what it returns; on
    /// loopback, runs it here. Sockets keep the namespace they were made in, and threads
    /// inherit their creator's, so what `f` binds, connects and spawns lives in the host.
    ///
    /// Errors: the namespace's file cannot be opened or entered (`setns`).
    pub fn enter<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        let Some(ns) = &self.netns else {
            return Ok(f());
        };
        let path = format!("/run/netns/{ns}");
        let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: setns(2) on a namespace file we hold open; it changes only this
                // thread's network namespace, and this thread ends with the scope.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(anyhow::Error::from(std::io::Error::last_os_error()))
                        .with_context(|| format!("entering {path}"));
                }
                Ok(f())
            })
            .join()
            .expect("a thread entering a namespace panicked")
        })
    }
}

impl Network {
    /// The hosts `kind` asks for; `tag` names the namespaces (see [`namespaces`](Self::namespaces)).
    /// `Auto` falls back to loopback, saying why on stderr, when namespaces cannot be made.
    pub fn of_kind(kind: NetworkKind, tag: &str) -> Result<Network> {
        Ok(match kind {
            NetworkKind::Loopback => Network::loopback(),
            NetworkKind::Netns => Network::namespaces(tag)?,
            NetworkKind::Auto if is_root() => match Network::namespaces(tag) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("network namespaces unavailable ({e:#}); using loopback");
                    Network::loopback()
                }
            },
            NetworkKind::Auto => Network::loopback(),
        })
    }

    /// Three loopback addresses.
    pub fn loopback() -> Network {
        let host = |name, d| Host {
            name,
            netns: None,
            ip: v4(127, 0, 0, d),
        };
        Network {
            seq: host("seq", 1),
            h1: host("h1", 2),
            h2: host("h2", 3),
            seq_from_h1: v4(127, 0, 0, 1),
            seq_from_h2: v4(127, 0, 0, 1),
            namespaces: Vec::new(),
        }
    }

    /// Three namespaces named `<tag>-seq`, `<tag>-h1`, `<tag>-h2`, joined by veth links.
    /// `tag` must be at most 8 characters (interface names are limited to 15).
    pub fn namespaces(tag: &str) -> Result<Network> {
        let mut net = Network {
            seq: Host {
                name: "seq",
                netns: Some(format!("{tag}-seq")),
                ip: v4(0, 0, 0, 0),
            },
            h1: Host {
                name: "h1",
                netns: Some(format!("{tag}-h1")),
                ip: v4(10, 77, 1, 2),
            },
            h2: Host {
                name: "h2",
                netns: Some(format!("{tag}-h2")),
                ip: v4(10, 77, 2, 2),
            },
            seq_from_h1: v4(10, 77, 1, 1),
            seq_from_h2: v4(10, 77, 2, 1),
            namespaces: Vec::new(),
        };
        for h in [&net.seq, &net.h1, &net.h2] {
            let ns = h.netns.clone().expect("set above");
            ip(&["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let seq_ns = net.seq.netns.clone().expect("set above");
        for (host, n) in [(&net.h1, 1), (&net.h2, 2)] {
            let ns = host.netns.clone().expect("set above");
            let (a, b) = (format!("{tag}s{n}"), format!("{tag}h{n}"));
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
            ip(&["link", "set", &a, "netns", &seq_ns])?;
            ip(&["link", "set", &b, "netns", &ns])?;
            ip(&[
                "-n",
                &seq_ns,
                "addr",
                "add",
                &format!("10.77.{n}.1/24"),
                "dev",
                &a,
            ])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.77.{n}.2/24"),
                "dev",
                &b,
            ])?;
            ip(&["-n", &seq_ns, "link", "set", &a, "up"])?;
            ip(&["-n", &ns, "link", "set", &b, "up"])?;
        }
        Ok(net)
    }

    /// Whether the hosts are namespaces.
    pub fn is_netns(&self) -> bool {
        !self.namespaces.is_empty()
    }

    /// The address the sequencer host's servers bind to.
    pub fn seq_bind(&self) -> IpAddr {
        self.seq.ip
    }

    /// The source address replication clients of host `h` connect from, as the sequencer
    /// host sees it.
    pub fn client_ip(&self, h: &Host) -> IpAddr {
        if self.is_netns() {
            h.ip
        } else {
            self.seq.ip
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}
