//! A sequencer group's leader cut off from etcd and from its standby by its link going down
//! (issue 14), with real hosts: network namespaces (root only; CI runs as root), the
//! demo's (`seqstream_apps::net`):
//!
//! ```text
//!   member 1 (seq 10.77.0.1) ── veth ──┐
//!   member 2 (seq2 10.77.0.4) ── veth ─┴─ bridge in the hub (coord 10.77.0.5):
//!                                         etcd, the client (a replica of the stream), the source
//! ```
//!
//! Member 1 leads; its link goes down. It must stop
//! acting (its fence lapses) before member 2 can lead term 2, which the test checks from
//! what each left behind, not from when the test saw it: member 1's store (a heartbeat every
//! 20 ms while it leads) ends a heartbeat or more before member 2's term-start frame. A link down is not a dead process: member 2
//! does not depose member 1, it waits for the lease. The client follows member 2, the source
//! resends, and when the link comes back member 1 cuts the tail it sequenced alone and
//! follows. Every message is in every store once, in order, and every store is a
//! byte-identical prefix of the leader's.

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use seqstream_apps::net::{is_root, Network};
use seqstream_store::{pattern, Tailer};
use seqstream_testkit::etcd::Etcd;
use seqstream_testkit::{counter, pattern_datagram, wait_counter, write_key, KillOnDrop};

const STREAM: u32 = 9;
const SOURCE: u32 = 1;
const LONG: Duration = Duration::from_secs(30);
const DATAGRAM_PORT: u16 = 7001;
const REPLICATION_PORT: u16 = 7101;

/// The source seqs of the store's messages in stream order, each payload checked, and the
/// term-start frames' `(term, timestamp ns)`.
fn read(dir: &Path) -> (Vec<u64>, Vec<(u32, u64)>) {
    let Ok(mut t) = Tailer::open(dir) else {
        return (Vec::new(), Vec::new());
    };
    let (mut seqs, mut terms) = (Vec::new(), Vec::new());
    while let Some(f) = t.poll().unwrap() {
        if let Some(s) = f.term_start() {
            terms.push((s.term, f.timestamp_ns()));
        } else if !f.is_heartbeat() {
            assert!(pattern::check(f.source_seq(), f.payload()));
            seqs.push(f.source_seq());
        }
    }
    (seqs, terms)
}

/// The timestamp of the store's last frame (timestamps never go back), ns since the epoch.
fn last_timestamp(dir: &Path) -> u64 {
    let mut t = Tailer::open(dir).unwrap();
    let mut last = 0;
    while let Some(f) = t.poll().unwrap() {
        last = f.timestamp_ns();
    }
    last
}

fn frames(dir: &Path) -> Vec<Vec<u8>> {
    let mut t = Tailer::open(dir).unwrap();
    let mut out = Vec::new();
    while let Some(f) = t.poll().unwrap() {
        out.push(f.as_bytes().to_vec());
    }
    out
}

struct Hosts {
    dir: tempfile::TempDir,
    net: Network,
    bin: PathBuf,
}

impl Hosts {
    fn member(&self, n: u32) -> &seqstream_apps::net::Host {
        if n == 1 {
            &self.net.seq
        } else {
            &self.net.seq2
        }
    }

    fn member_ip(&self, n: u32) -> IpAddr {
        self.member(n).ip
    }

    fn hub_ip(&self) -> IpAddr {
        self.net.coord.ip
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn ns(&self, n: u32) -> String {
        self.member(n).netns.clone().unwrap()
    }

    /// Starts `seqstreamd` on `text` in namespace `ns`; its log in `<name>.log`.
    fn spawn(&self, ns: &str, name: &str, text: &str) -> KillOnDrop {
        let file = self.path(&format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{name}.log")))
            .unwrap();
        KillOnDrop::spawn(
            seqstream_apps::net::command_in(Some(ns), &self.bin)
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

    fn start_member(&self, n: u32, etcd: &Etcd) -> KillOnDrop {
        let text = format!(
            r#"
[[sequencer_group]]
name = "md"
store = "{store}"
stream_id = {STREAM}
listen = "{me}:{DATAGRAM_PORT}"
source = ["{SOURCE}@{hub}"]
heartbeat_ms = 20
segment_size = 1048576
node_id = {n}
member = ["1={m1}:{REPLICATION_PORT}", "2={m2}:{REPLICATION_PORT}"]
etcd = ["{etcd}"]
etcd_prefix = "/seqstream/netns-test"
lease_ttl_s = 1
bootstrap = {bootstrap}
secret_file = "{secret}"
allow = ["{hub}"]
"#,
            store = self.path(&format!("store-{n}")).display(),
            me = self.member_ip(n),
            hub = self.hub_ip(),
            m1 = self.member_ip(1),
            m2 = self.member_ip(2),
            etcd = etcd.endpoint(),
            bootstrap = n == 1,
            secret = self.path("secret").display(),
        );
        self.spawn(&self.ns(n), &format!("member-{n}"), &text)
    }

    fn counters(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.counters"))
    }

    fn logs(&self) -> String {
        ["member-1.log", "member-2.log", "client.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.path(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    }

    fn wait_messages(&self, dir: &Path, n: usize) {
        let deadline = Instant::now() + LONG;
        while read(dir).0.len() < n {
            assert!(
                Instant::now() < deadline,
                "{} holds {} of {n} messages:\n{}",
                dir.display(),
                read(dir).0.len(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Sends `seqs` from `source` to `to` in datagrams of 10, every 10 ms, until the store `dir`
/// holds every message up to the last of `seqs` (what is lost on the way is sent again).
fn send_until(
    h: &Hosts,
    source: &UdpSocket,
    to: SocketAddr,
    seqs: std::ops::Range<u64>,
    dir: &str,
) {
    let deadline = Instant::now() + LONG;
    let total = seqs.end as usize - 1;
    while read(&h.path(dir)).0.len() < total {
        assert!(Instant::now() < deadline, "not delivered:\n{}", h.logs());
        let mut s = seqs.start;
        while s < seqs.end {
            let e = (s + 10).min(seqs.end);
            source
                .send_to(&pattern_datagram(STREAM, SOURCE, s..e), to)
                .unwrap();
            s = e;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_leader_whose_link_goes_down_stops_before_its_standby_leads_and_rejoins_after() {
    assert!(
        is_root(),
        "this test makes network namespaces and needs root (CI runs as root)"
    );
    let bin = common::ensure_daemons().join("seqstreamd");
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("{:>8.3} s  {what}", t0.elapsed().as_secs_f64());
    let tag = format!("gn{}", std::process::id() % 100_000);
    let net = Network::namespaces(&tag).unwrap();
    let hub = net.coord.netns.clone().unwrap();
    let h = Hosts {
        dir: tempfile::tempdir().unwrap(),
        net,
        bin,
    };
    write_key(&h.path("secret"), "the replication key of the netns test");

    let etcd = h.net.coord.enter(|| Etcd::start_on(&[h.hub_ip()])).unwrap();
    let _one = h.start_member(1, &etcd);
    let _two = h.start_member(2, &etcd);
    let state = "md member state (0 idle 1 standby 2 leader)";
    wait_counter(&h.counters("member-1"), state, LONG, |v| v == 2);
    wait_counter(&h.counters("member-2"), "md member eligible", LONG, |v| {
        v == 1
    });
    let in_sync = || {
        h.net
            .coord
            .enter(|| etcd.get("/seqstream/netns-test/in-sync"))
            .unwrap()
    };
    let deadline = Instant::now() + LONG;
    while !in_sync().is_some_and(|s| s.contains("[1,2]")) {
        assert!(Instant::now() < deadline, "in-sync: {:?}", in_sync());
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = format!(
        r#"
[[follow]]
name = "rep"
store = "{store}"
stream_id = {STREAM}
secret_file = "{secret}"
upstream = ["{m1}:{REPLICATION_PORT}", "{m2}:{REPLICATION_PORT}"]
heartbeat_ms = 50
peer_timeout_ms = 500
max_segment_size = 1048576
"#,
        store = h.path("client").display(),
        secret = h.path("secret").display(),
        m1 = h.member_ip(1),
        m2 = h.member_ip(2),
    );
    let _client = h.spawn(&hub, "client", &client);
    let source = h
        .net
        .coord
        .enter(|| UdpSocket::bind(SocketAddr::new(h.hub_ip(), 0)).unwrap())
        .unwrap();
    let to = |n: u32| SocketAddr::new(h.member_ip(n), DATAGRAM_PORT);
    phase("member 1 leads, member 2 in sync");
    send_until(&h, &source, to(1), 1..201, "client");
    phase("200 messages at the client");

    // Member 1's link goes down: it loses etcd and its standby at once.
    h.net.set_link(&h.net.seq, false).unwrap();
    let lapses = h.counters("member-1");
    let deadline = Instant::now() + LONG;
    while counter(&lapses, "md member lapses").unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "member 1 never lapsed");
        std::thread::sleep(Duration::from_millis(1));
    }
    phase("member 1's link down: its fence lapsed");
    wait_counter(
        &h.counters("member-2"),
        "md member leader term",
        LONG,
        |v| v == 2,
    );
    // Member 2 sequences; with its only standby cut off, it releases nothing (standby-ack
    // blocks): the client holds what it had.
    phase("member 2 leads term 2");
    send_until(&h, &source, to(2), 201..301, "store-2");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        read(&h.path("client")).0.len(),
        200,
        "released what no standby held"
    );
    let (_, terms) = read(&h.path("store-2"));
    let term2_ns = terms
        .iter()
        .find(|t| t.0 == 2)
        .expect("a term-2 start frame")
        .1;
    // While it leads, member 1 appends a frame at least every heartbeat (20 ms): a last
    // frame a heartbeat or more before term 2 says it had stopped leading by then.
    let member1_last_ns = last_timestamp(&h.path("store-1"));
    assert!(
        member1_last_ns + 20_000_000 <= term2_ns,
        "member 1 appended at {member1_last_ns} ns, within a heartbeat of member 2's term 2 at {term2_ns} ns"
    );
    assert_eq!(
        counter(&h.counters("member-2"), "md member leaders deposed"),
        Some(0),
        "a link down was taken for a dead process"
    );

    // The link comes back: member 1 finds term 2, cuts what it sequenced alone, follows;
    // release resumes.
    h.net.set_link(&h.net.seq, true).unwrap();
    wait_counter(&h.counters("member-1"), state, LONG, |v| v == 1);
    phase("member 1's link up: it follows");
    wait_counter(&h.counters("member-1"), "md frames cut", LONG, |v| v > 0);
    h.wait_messages(&h.path("client"), 300);
    phase("member 1 cut its tail; 300 messages at the client");
    send_until(&h, &source, to(2), 301..311, "client");
    h.wait_messages(&h.path("store-1"), 310);
    phase("310 messages at the client and in member 1's store");
    let leader = frames(&h.path("store-2"));
    for dir in ["client", "store-1"] {
        let dir = h.path(dir);
        assert_eq!(
            read(&dir).0,
            (1..=310).collect::<Vec<u64>>(),
            "{}",
            dir.display()
        );
        let ours = frames(&dir);
        assert!(
            ours.len() <= leader.len() && ours[..] == leader[..ours.len()],
            "{} is not a prefix of the leader's store",
            dir.display()
        );
    }
    eprintln!(
        "member 1's last frame {:.0} ms before member 2's term-2 start",
        (term2_ns - member1_last_ns) as f64 / 1e6
    );
}
