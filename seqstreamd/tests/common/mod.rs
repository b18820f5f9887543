//! What the sequencer group tests share: a group of `seqstreamd` members over a real etcd, a
//! client host (a `seqstreamd` replicating the stream and forwarding its applications'
//! messages), and readers of the stores they write. The hosts are loopback addresses
//! ([`Group::with`]: member 1 on 127.0.0.3, 2 on 127.0.0.2, 3 on 127.0.0.4, the client and
//! etcd on 127.0.0.1), or network namespaces ([`Group::in_namespaces`], root only: the demo's
//! hosts of `seqstream_apps::net`, member 1 on `seq`, 2 on `seq2`, 3 on `h2`, the client on
//! `h1`, etcd on `coord`).
#![allow(dead_code)] // each test crate uses a different part of this module

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use seqstream_apps::net::Network;
use seqstream_store::Tailer;
use seqstream_testkit::etcd::Etcd;
use seqstream_testkit::relay::LossyRelay;
use seqstream_testkit::{free_tcp_port, free_udp_port, wait_counter, write_key, KillOnDrop};

pub(crate) const STREAM: u32 = 4;
pub(crate) const KEY: &str = "the replication key of the group tests";
pub(crate) const LONG: Duration = Duration::from_secs(30);
/// The member's state counter: 0 idle, 1 standby, 2 leader.
pub(crate) const STATE: &str = "md member state (0 idle 1 standby 2 leader)";

/// One member: its node id, address, ports and files.
pub(crate) struct Member {
    pub(crate) node: u32,
    ip: IpAddr,
    datagram: u16,
    replication: u16,
    /// Its host's network namespace (`None` on loopback).
    netns: Option<String>,
}

pub(crate) struct Group {
    dir: tempfile::TempDir,
    pub(crate) etcd: Etcd,
    members: Vec<Member>,
    /// The client host's address: where its replication connections and its relays'
    /// datagrams come from.
    client_ip: IpAddr,
    /// The namespaces, when the hosts are namespaces (dropped last: it removes them).
    net: Option<Network>,
    /// The members' `lease_ttl_s` (1 unless a test sets another before starting them).
    pub(crate) lease_ttl_s: u32,
}

impl Group {
    pub(crate) fn new() -> Group {
        Group::with(2)
    }

    /// A group of `n` members (2 or 3) on loopback addresses.
    pub(crate) fn with(n: usize) -> Group {
        let dir = tempfile::tempdir().unwrap();
        write_key(&dir.path().join("secret"), KEY);
        let member = |node, d: u8| Member {
            node,
            ip: IpAddr::from([127, 0, 0, d]),
            datagram: free_udp_port(),
            replication: free_tcp_port(),
            netns: None,
        };
        Group {
            dir,
            etcd: Etcd::start(),
            members: [member(1, 3), member(2, 2), member(3, 4)]
                .into_iter()
                .take(n)
                .collect(),
            client_ip: IpAddr::from([127, 0, 0, 1]),
            net: None,
            lease_ttl_s: 1,
        }
    }

    /// A group of `n` members (2 or 3) on hosts of their own: network namespaces named after
    /// `tag` (at most 8 characters); member 3 on `h2`. Needs root.
    pub(crate) fn in_namespaces(tag: &str, n: usize) -> Group {
        assert!(
            seqstream_apps::net::is_root(),
            "this test makes network namespaces and needs root (CI runs as root)"
        );
        let net = Network::namespaces(tag).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_key(&dir.path().join("secret"), KEY);
        let coord = net.coord.ip;
        let etcd = net.coord.enter(|| Etcd::start_on(&[coord])).unwrap();
        let member = |node, host: &seqstream_apps::net::Host| Member {
            node,
            ip: host.ip,
            datagram: free_udp_port(),
            replication: free_tcp_port(),
            netns: host.netns.clone(),
        };
        Group {
            dir,
            etcd,
            members: [
                member(1, &net.seq),
                member(2, &net.seq2),
                member(3, &net.h2),
            ]
            .into_iter()
            .take(n)
            .collect(),
            client_ip: net.h1.ip,
            net: Some(net),
            lease_ttl_s: 1,
        }
    }

    pub(crate) fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// The members' node ids.
    pub(crate) fn nodes(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.node).collect()
    }

    pub(crate) fn member(&self, node: u32) -> &Member {
        &self.members[node as usize - 1]
    }

    pub(crate) fn store(&self, node: u32) -> PathBuf {
        self.path(&format!("store-{node}"))
    }

    pub(crate) fn counters(&self, node: u32) -> PathBuf {
        self.path(&format!("member-{node}.counters"))
    }

    pub(crate) fn datagram_addr(&self, node: u32) -> SocketAddr {
        let m = self.member(node);
        SocketAddr::new(m.ip, m.datagram)
    }

    pub(crate) fn replication_addr(&self, node: u32) -> SocketAddr {
        let m = self.member(node);
        SocketAddr::new(m.ip, m.replication)
    }

    /// A lossy relay ([`LossyRelay`]) on the client host to member `node`'s datagram address.
    pub(crate) fn relay(&self, node: u32, seed: u64) -> LossyRelay {
        let (ip, to) = (self.client_ip, self.datagram_addr(node));
        match &self.net {
            Some(net) => net.h1.enter(|| LossyRelay::start_on(ip, to, seed)).unwrap(),
            None => LossyRelay::start_on(ip, to, seed),
        }
    }

    /// `seqstreamd` run on member `node`'s host (in its namespace, if any).
    pub(crate) fn seqstreamd(&self, node: u32) -> Command {
        command(self.member(node).netns.as_deref())
    }

    /// Starts member `node`'s seqstreamd.
    pub(crate) fn start(&self, node: u32, bootstrap: bool) -> KillOnDrop {
        self.start_with(node, bootstrap, "")
    }

    /// Starts member `node`'s seqstreamd with `extra` lines in its `[[sequencer_group]]`.
    pub(crate) fn start_with(&self, node: u32, bootstrap: bool, extra: &str) -> KillOnDrop {
        self.start_file(node, bootstrap, "", extra)
    }

    /// Starts member `node`'s seqstreamd with `top` lines before its `[[sequencer_group]]`
    /// (its threading, say) and `extra` lines in it.
    pub(crate) fn start_file(
        &self,
        node: u32,
        bootstrap: bool,
        top: &str,
        extra: &str,
    ) -> KillOnDrop {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("\"{}={}\"", m.node, SocketAddr::new(m.ip, m.replication)))
            .collect();
        let text = format!(
            r#"{top}
[[sequencer_group]]
name = "md"
store = "{store}"
stream_id = {STREAM}
listen = "{listen}"
source = ["1@{client}", "2@{client}", "3@{client}"]
segment_size = 1048576
heartbeat_ms = 20
node_id = {node}
member = [{members}]
etcd = ["{etcd}"]
etcd_prefix = "/seqstream/group-test"
lease_ttl_s = {lease_ttl_s}
bootstrap = {bootstrap}
secret_file = "{secret}"
allow = ["{client}"]
{extra}
"#,
            store = self.store(node).display(),
            listen = self.datagram_addr(node),
            members = members.join(", "),
            etcd = self.etcd.endpoint(),
            secret = self.path("secret").display(),
            client = self.client_ip,
            lease_ttl_s = self.lease_ttl_s,
        );
        let netns = self.member(node).netns.clone();
        self.spawn(&format!("member-{node}"), netns.as_deref(), &text)
    }

    /// Starts a `seqstreamd` on `text` as `<name>.toml` in namespace `netns` (if any), its
    /// counters in `<name>.counters`, its log appended to `<name>.log` (a restarted member's
    /// log goes on).
    fn spawn(&self, name: &str, netns: Option<&str>, text: &str) -> KillOnDrop {
        let file = self.path(&format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{name}.log")))
            .unwrap();
        KillOnDrop::spawn(
            command(netns)
                .arg("--config")
                .arg(&file)
                .arg("--counters")
                .arg(self.path(&format!("{name}.counters")))
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log),
        )
        .unwrap()
    }

    /// The outbox of source `source` on the client host.
    pub(crate) fn outbox(&self, source: u32) -> PathBuf {
        self.path(&format!("app{source}.outbox"))
    }

    /// Starts the client host: a replica of the stream following whichever member leads, and a
    /// forwarder of sources `1..=sources` ([`outbox`](Self::outbox), which must exist) sending
    /// to whichever of `sequencers` leads (the members' datagram addresses, or relays to them:
    /// `sequencers[i]` stands for member `i + 1`, named by node id in the route, so the
    /// forwarder also follows the leader a term-start frame names).
    pub(crate) fn start_client(&self, sequencers: &[SocketAddr], sources: u32) -> KillOnDrop {
        let upstreams: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("\"{}\"", self.replication_addr(m.node)))
            .collect();
        let text = format!(
            r#"
[[follow]]
name = "rep"
store = "{replica}"
stream_id = {STREAM}
secret_file = "{secret}"
upstream = [{upstreams}]
max_segment_size = 1048576

[[forward]]
name = "fwd"
outbox = [{outboxes}]
route = ["{STREAM}={sequencers}={replica}"]
resend_timeout_ms = 100
"#,
            replica = self.path("client").display(),
            secret = self.path("secret").display(),
            upstreams = upstreams.join(", "),
            outboxes = (1..=sources)
                .map(|s| format!("\"{}\"", self.outbox(s).display()))
                .collect::<Vec<_>>()
                .join(", "),
            sequencers = sequencers
                .iter()
                .zip(1..)
                .map(|(a, node)| format!("{node}@{a}"))
                .collect::<Vec<_>>()
                .join(","),
        );
        let netns = self.net.as_ref().and_then(|n| n.h1.netns.clone());
        self.spawn("client", netns.as_deref(), &text)
    }

    pub(crate) fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("member-{}.log", m.node))
            .chain(["client.log".to_string()])
            .map(|f| std::fs::read_to_string(self.path(&f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    }

    /// The node ids of the in-sync set etcd holds (`None`: no in-sync key).
    pub(crate) fn in_sync(&self) -> Option<Vec<u32>> {
        let key = "/seqstream/group-test/in-sync";
        let v = match &self.net {
            Some(net) => net.coord.enter(|| self.etcd.get(key)).unwrap(),
            None => self.etcd.get(key),
        }?;
        let r: serde_json::Value = serde_json::from_str(&v).unwrap();
        Some(
            r["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap() as u32)
                .collect(),
        )
    }

    pub(crate) fn wait_state(&self, node: u32, state: u64) {
        wait_counter(&self.counters(node), STATE, LONG, |v| v == state);
    }
}

/// `seqstreamd` in namespace `netns`, if any.
fn command(netns: Option<&str>) -> Command {
    seqstream_apps::net::command_in(netns, env!("CARGO_BIN_EXE_seqstreamd"))
}

/// Every frame of the store: its position and bytes.
pub(crate) fn frames(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let mut t = Tailer::open(dir).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        out.push((f.position(), f.as_bytes().to_vec()));
    }
    out
}

/// The payload the client's application offers as message `seq` of source `source`.
pub(crate) fn payload(source: u32, seq: u64) -> String {
    format!("source {source} message {seq:06}")
}

/// The client's messages in the store at `dir`, in stream order: `(source, source seq)`, each
/// payload checked ([`payload`]).
pub(crate) fn offered(dir: &Path) -> Vec<(u32, u64)> {
    let Ok(mut t) = Tailer::open(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        if f.is_heartbeat() {
            continue;
        }
        let (source, seq) = (f.source_id(), f.source_seq());
        assert_eq!(f.payload(), payload(source, seq).as_bytes());
        out.push((source, seq));
    }
    out
}
