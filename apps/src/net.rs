//! The simulated hosts of the demo, `bench e2e` and the network-namespace tests: network
//! namespaces on one bridge (as root), or loopback addresses (otherwise). Processes enter a
//! host with `ip netns exec`; threads of one process with [`Host::enter`].
//!
//! With namespaces, every host has one veth link to a bridge that lives in the coordination
//! host's namespace (where the demo runs etcd), all in one subnet:
//!
//! ```text
//!   seq 10.77.0.1   seq2 10.77.0.4   h1 10.77.0.2   h2 10.77.0.3
//!       │               │                │              │
//!       └──── veth ─────┴──── veth ──────┴──── veth ────┘
//!                  bridge in `<tag>-coord`, which is 10.77.0.5 on it
//! ```
//!
//! A host's link can go down on the bridge's side ([`Network::set_link`]): the host is then
//! cut off from every other, as a pulled cable would cut it.
//!
//! On loopback the sequencer hosts are 127.0.0.4 and 127.0.0.5, the application hosts
//! 127.0.0.2 and 127.0.0.3, the coordination host 127.0.0.1 (Linux routes all of 127/8 to
//! `lo`). A TCP client that does not bind then connects from 127.0.0.1 whatever host it
//! plays ([`Network::client_ip`]), which the replication allow-lists account for; no
//! sequencer host is 127.0.0.1, so a sequencer group's members (which connect from their
//! own address) are never taken for a consumer.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Which hosts to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkKind {
    /// Namespaces when run as root and `ip netns` works, loopback otherwise.
    Auto,
    /// Network namespaces on one bridge (root).
    Netns,
    /// Loopback addresses 127.0.0.1-5.
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
    /// `seq`, `seq2`, `h1`, `h2` or `coord`.
    pub name: &'static str,
    /// Its namespace, when namespaces are used.
    pub netns: Option<String>,
    /// Its address: what its processes bind to, and how every other host reaches it.
    pub ip: IpAddr,
    /// Its link's port on the bridge (namespaces only; the coordination host has none).
    link: Option<String>,
}

/// The hosts.
pub struct Network {
    /// The sequencer host (member 1 of the demo's sequencer groups).
    pub seq: Host,
    /// The second sequencer host (member 2: the standby).
    pub seq2: Host,
    /// Application host 1 (algo).
    pub h1: Host,
    /// Application host 2 (OMS, feed handlers; the demo's compositor).
    pub h2: Host,
    /// The coordination host (etcd); with namespaces, the bridge's.
    pub coord: Host,
    namespaces: Vec<String>,
    /// The namespaces' tag, whose maker this process is recorded as ([`OWNERS`]).
    tag: Option<String>,
}

/// Where the maker of each set of namespaces is recorded: `<OWNERS>/<tag>` holds its pid, so
/// that a later run with the same tag removes a set whose maker was killed before it could
/// (`SIGKILL`: no `Drop` runs).
const OWNERS: &str = "/run/seqstream-netns";

fn owner_file(tag: &str) -> PathBuf {
    Path::new(OWNERS).join(tag)
}

/// Removes those of the namespaces `names` (of `tag`) that exist when the process recorded as
/// their maker no longer runs, saying so on stderr. A set whose maker runs, or that records
/// no maker, is left alone (making it again then fails, naming the namespace that exists).
fn remove_orphans(tag: &str, names: &[String]) -> Result<()> {
    let present: Vec<&String> = names
        .iter()
        .filter(|ns| Path::new("/run/netns").join(ns).exists())
        .collect();
    if present.is_empty() {
        return Ok(());
    }
    let maker = std::fs::read_to_string(owner_file(tag))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let Some(pid) = maker.filter(|pid| !Path::new(&format!("/proc/{pid}")).exists()) else {
        return Ok(());
    };
    for ns in present {
        ip(&["netns", "del", ns])?;
    }
    let _ = std::fs::remove_file(owner_file(tag));
    eprintln!("removed the namespaces of tag {tag} left by process {pid}, which no longer runs");
    Ok(())
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

/// The last byte of a host's IPv4 address: its number in its interfaces' names.
fn host_number(h: &Host) -> u8 {
    match h.ip {
        IpAddr::V4(a) => a.octets()[3],
        IpAddr::V6(a) => a.octets()[15],
    }
}

/// `program` to run inside network namespace `netns` (`ip netns exec`, which execs it, so the
/// child's pid is the program's), or here when `netns` is `None`.
pub fn command_in(netns: Option<&str>, program: impl AsRef<OsStr>) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

impl Host {
    /// `program` to run in this host ([`command_in`] its namespace).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        command_in(self.netns.as_deref(), program)
    }

    /// Runs `f` on a thread inside this host's namespace and returns what it returns; on
    /// loopback, runs it here. Sockets keep the namespace they were made in, and threads
    /// and child processes inherit their creator's, so what `f` binds, connects and spawns
    /// lives in the host.
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

    /// Loopback addresses (see the module's documentation).
    pub fn loopback() -> Network {
        let host = |name, d| Host {
            name,
            netns: None,
            ip: v4(127, 0, 0, d),
            link: None,
        };
        Network {
            seq: host("seq", 4),
            seq2: host("seq2", 5),
            h1: host("h1", 2),
            h2: host("h2", 3),
            coord: host("coord", 1),
            namespaces: Vec::new(),
            tag: None,
        }
    }

    /// Namespaces `<tag>-seq`, `<tag>-seq2`, `<tag>-h1`, `<tag>-h2` and `<tag>-coord`, the
    /// latter holding the bridge (see the module's documentation). `tag` must be at most 8
    /// characters (interface names are limited to 15). On an error, what was made is
    /// removed. Namespaces of `tag` that a process no longer running made (it was killed
    /// before it could remove them) are removed first; the maker's pid is recorded in
    /// `/run/seqstream-netns/<tag>` while the set lives.
    pub fn namespaces(tag: &str) -> Result<Network> {
        if tag.len() > 8 {
            bail!(
                "namespace tag {tag:?}: at most 8 characters (interface names are limited to 15)"
            );
        }
        let host = |name: &'static str, d: u8| Host {
            name,
            netns: Some(format!("{tag}-{name}")),
            ip: v4(10, 77, 0, d),
            link: (name != "coord").then(|| format!("{tag}p{d}")),
        };
        let mut net = Network {
            seq: host("seq", 1),
            seq2: host("seq2", 4),
            h1: host("h1", 2),
            h2: host("h2", 3),
            coord: host("coord", 5),
            namespaces: Vec::new(),
            tag: None,
        };
        let coord = net.coord.netns.clone().expect("set above");
        let names: Vec<String> = net.hosts().iter().filter_map(|h| h.netns.clone()).collect();
        remove_orphans(tag, &names)?;
        for ns in names {
            ip(&["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            if net.tag.is_none() {
                // The first was made: the set is this process's (none of it existed).
                net.tag = Some(tag.to_string());
                std::fs::create_dir_all(OWNERS).with_context(|| format!("creating {OWNERS}"))?;
                std::fs::write(owner_file(tag), std::process::id().to_string())
                    .with_context(|| format!("writing {}", owner_file(tag).display()))?;
            }
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let bridge = format!("{tag}br");
        ip(&["-n", &coord, "link", "add", &bridge, "type", "bridge"])?;
        ip(&["-n", &coord, "link", "set", &bridge, "up"])?;
        let cidr = |h: &Host| format!("{}/24", h.ip);
        ip(&[
            "-n",
            &coord,
            "addr",
            "add",
            &cidr(&net.coord),
            "dev",
            &bridge,
        ])?;
        for h in [&net.seq, &net.seq2, &net.h1, &net.h2] {
            let ns = h.netns.as_deref().expect("set above");
            let port = h.link.as_deref().expect("set above");
            let end = format!("{tag}v{}", host_number(h));
            // Made in place, each end in its namespace: nothing is left in this one, and
            // deleting the namespaces deletes the pair.
            ip(&[
                "link", "add", &end, "netns", ns, "type", "veth", "peer", "name", port, "netns",
                &coord,
            ])?;
            ip(&["-n", &coord, "link", "set", port, "master", &bridge])?;
            ip(&["-n", &coord, "link", "set", port, "up"])?;
            ip(&["-n", ns, "addr", "add", &cidr(h), "dev", &end])?;
            ip(&["-n", ns, "link", "set", &end, "up"])?;
        }
        Ok(net)
    }

    /// Every host.
    pub fn hosts(&self) -> [&Host; 5] {
        [&self.seq, &self.seq2, &self.h1, &self.h2, &self.coord]
    }

    /// Whether the hosts are namespaces.
    pub fn is_netns(&self) -> bool {
        !self.namespaces.is_empty()
    }

    /// The source address the other hosts see on a connection from host `h` that did not
    /// bind: `h`'s own with namespaces, 127.0.0.1 on loopback.
    pub fn client_ip(&self, h: &Host) -> IpAddr {
        if self.is_netns() {
            h.ip
        } else {
            v4(127, 0, 0, 1)
        }
    }

    /// Takes host `h`'s link up or down at the bridge. Down, `h` reaches no other host and
    /// none reaches it; its own sockets see nothing (no error), as with a pulled cable.
    ///
    /// Errors: on loopback, or for the coordination host (which has no link); `ip` fails.
    pub fn set_link(&self, h: &Host, up: bool) -> Result<()> {
        let (Some(port), Some(coord)) = (&h.link, &self.coord.netns) else {
            bail!("host {} has no link to take down", h.name);
        };
        ip(&[
            "-n",
            coord,
            "link",
            "set",
            port,
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
        if let Some(tag) = &self.tag {
            let _ = std::fs::remove_file(owner_file(tag));
        }
    }
}
