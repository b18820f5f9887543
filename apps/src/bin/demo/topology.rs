//! The demo's topology: which roles each host's `seqstreamd` runs, as the host files it
//! writes. The same function renders the demo's files (simulated hosts, a work directory,
//! unpinned) and the example files of real hosts in `config/` (`demo --write-config DIR`;
//! `apps/tests/configs.rs` checks that `config/` is exactly that), so the demo and a real
//! deployment cannot drift apart.
//!
//! ```text
//!  seq host  : member 1 of each stream's sequencer group (`<stream>-seq`, bootstrap)
//!  seq2 host : member 2 of each (its standby): md-seq (stream 1), orders-seq (2), itch-seq (4)
//!  host 1    : orders-rep, composite-rep, fwd (the algo's outbox → orders-seq)
//!  host 2    : md-rep, orders-rep, itch-rep, composite (3 = 1 + 2 [+ 4], merged from those
//!              replicas), composite-serve, fwd (the OMS's and feed handlers' outboxes)
//! ```
//!
//! Every sequenced stream is a two-member sequencer group under `standby-ack` (`DESIGN.md`,
//! "Sequencer failover"; etcd on a host of its own): consumers receive a frame only once
//! the standby holds it, so either member can take over without loss. The composite is merged
//! on host 2 from its replicas, which hold only released frames: a compositor on a
//! sequencer host would merge frames its standby might never have had, and would die with it.

use std::net::IpAddr;
use std::path::PathBuf;

use seqstream_apps::streams::{COMPOSITE, ITCH, MARKET_DATA, ORDERS};
use seqstream_sequencer::sequencer::MIN_FENCED_SEGMENT_SIZE;
use toml::{Table, Value};

/// Source ids of the publishers.
pub(crate) const FEED_SOURCE: u32 = 1;
/// The ITCH feed handler's source id.
pub(crate) const ITCH_SOURCE: u32 = 4;
/// The algo's source id.
pub(crate) const ALGO_SOURCE: u32 = 11;
/// The OMS's source id.
pub(crate) const OMS_SOURCE: u32 = 21;

/// Which thread layout every host's `seqstreamd` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Threading {
    /// Every role, and every replica's sender, on a thread of its own.
    Dedicated,
    /// Every role of a host on one thread.
    Shared,
}

impl Threading {
    /// The `threading` value of a host file.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Threading::Dedicated => "dedicated",
            Threading::Shared => "shared",
        }
    }
}

/// Where and how the topology is laid out.
pub(crate) struct Site {
    /// Market-data streams: CME MDP3 (stream 1) and Nasdaq ITCH (stream 4).
    pub cme: bool,
    /// See `cme`.
    pub itch: bool,
    /// The sequencer hosts' addresses: `seq` (member 1 of every group) and `seq2` (member 2).
    pub seq_ip: [IpAddr; 2],
    /// Host 1's and host 2's own addresses (their datagrams' source).
    pub host_ip: [IpAddr; 2],
    /// Host 1's and host 2's addresses as the other hosts see their connections.
    pub client_ip: [IpAddr; 2],
    /// etcd's client URLs.
    pub etcd: Vec<String>,
    /// The sequencer groups' lease TTL, s: a dead leader that is not deposed at once is
    /// replaced after about this.
    pub lease_ttl_s: u64,
    /// The directory of host `seq`, `seq2`, `h1` or `h2`'s stores.
    pub stores: fn(&Site, &str) -> PathBuf,
    /// The directory of a host's outboxes.
    pub outboxes: fn(&Site, &str) -> PathBuf,
    /// Where each host's counters file is (`None`: seqstreamd's default).
    pub counters: fn(&Site, &str) -> Option<PathBuf>,
    /// The replication secret file (the same file on every host).
    pub secret: PathBuf,
    /// The directory of the sources' key files, `source-<id>.key` (the same files on the
    /// sequencer host and on the source's host).
    pub keys: PathBuf,
    /// The work directory of the demo (unused for real hosts).
    pub work: PathBuf,
    /// The group of stream port `n` listens on UDP `port_base + n`, its members' replication
    /// servers on TCP `port_base + 10 + n` (each member on its own host's address); the
    /// composite's server on host 2, TCP `port_base + 13`.
    pub port_base: u16,
    /// Segment size of every store, bytes (the sequencer groups' at least
    /// `MIN_FENCED_SEGMENT_SIZE`).
    pub segment_size: u64,
    /// Sequencers append heartbeat frames after this many ms without appending (`None`: never).
    pub heartbeat_ms: Option<u64>,
    /// The thread layout.
    pub threading: Threading,
    /// The idle strategy of every thread.
    pub idle: String,
    /// Pin threads to cores (real hosts: a core each, as `docs/host-tuning.md` explains).
    pub pinned: bool,
}

/// The UDP port offset of each sequenced stream (TCP: 10 more), and its name.
const STREAMS: [(u32, &str, u16); 4] = [
    (MARKET_DATA, "md", 1),
    (ORDERS, "orders", 2),
    (COMPOSITE, "composite", 3),
    (ITCH, "itch", 4),
];

fn port(stream: u32) -> u16 {
    STREAMS
        .iter()
        .find(|(s, _, _)| *s == stream)
        .map(|(_, _, p)| *p)
        .expect("a stream of the topology")
}

/// The short name of `stream` (`md`, `orders`, `composite`, `itch`): its store directory and
/// the prefix of its roles' names.
pub(crate) fn stream_name(stream: u32) -> &'static str {
    STREAMS
        .iter()
        .find(|(s, _, _)| *s == stream)
        .map(|(_, n, _)| *n)
        .expect("a stream of the topology")
}

fn s(p: &std::path::Path) -> Value {
    Value::String(p.display().to_string())
}

fn strings<I: IntoIterator<Item = String>>(v: I) -> Value {
    Value::Array(v.into_iter().map(Value::String).collect())
}

impl Site {
    /// The store of `stream` on `host`.
    pub(crate) fn store(&self, host: &str, stream: u32) -> PathBuf {
        (self.stores)(self, host).join(stream_name(stream))
    }

    /// The outbox file `file` on `host`.
    pub(crate) fn outbox(&self, host: &str, file: &str) -> PathBuf {
        (self.outboxes)(self, host).join(file)
    }

    /// The streams the seq host sequences, in the compositor's merge order.
    pub(crate) fn sequenced(&self) -> Vec<u32> {
        let mut v = Vec::new();
        if self.cme {
            v.push(MARKET_DATA);
        }
        v.push(ORDERS);
        if self.itch {
            v.push(ITCH);
        }
        v
    }

    /// The replicas each application host keeps (host index 0 or 1).
    pub(crate) fn replicas(&self, host: usize) -> Vec<u32> {
        if host == 0 {
            vec![ORDERS, COMPOSITE]
        } else {
            let mut v = Vec::new();
            if self.cme {
                v.push(MARKET_DATA);
            }
            v.push(ORDERS);
            if self.itch {
                v.push(ITCH);
            }
            v
        }
    }

    /// The outboxes each application host's forwarder drains: (file, source id, stream).
    pub(crate) fn outboxes_of(&self, host: usize) -> Vec<(&'static str, u32, u32)> {
        if host == 0 {
            return vec![("algo.outbox", ALGO_SOURCE, ORDERS)];
        }
        let mut v = vec![("oms.outbox", OMS_SOURCE, ORDERS)];
        if self.cme {
            v.push(("feed.outbox", FEED_SOURCE, MARKET_DATA));
        }
        if self.itch {
            v.push(("itch.outbox", ITCH_SOURCE, ITCH));
        }
        v
    }

    /// The key file of source `id`.
    pub(crate) fn source_key(&self, id: u32) -> PathBuf {
        self.keys.join(format!("source-{id}.key"))
    }

    /// Every source's id.
    pub(crate) fn all_sources() -> Vec<u32> {
        [MARKET_DATA, ORDERS, ITCH]
            .into_iter()
            .flat_map(Self::sources)
            .map(|(id, _)| id)
            .collect()
    }

    /// `source_key` values of `ids`: `ID=KEY_FILE` each.
    fn source_keys(&self, ids: impl IntoIterator<Item = u32>) -> Value {
        strings(
            ids.into_iter()
                .map(|id| format!("{id}={}", self.source_key(id).display())),
        )
    }

    /// The sources allowed on `stream`: (source id, host index).
    fn sources(stream: u32) -> Vec<(u32, usize)> {
        match stream {
            MARKET_DATA => vec![(FEED_SOURCE, 1)],
            ORDERS => vec![(ALGO_SOURCE, 0), (OMS_SOURCE, 1)],
            ITCH => vec![(ITCH_SOURCE, 1)],
            _ => Vec::new(),
        }
    }

    /// The hosts (indexes) that keep a replica of `stream`.
    pub(crate) fn replicated_to(&self, stream: u32) -> Vec<usize> {
        (0..2)
            .filter(|&h| self.replicas(h).contains(&stream))
            .collect()
    }

    /// The top of a host file: threading, counters, and the shared thread's settings.
    fn header(&self, host: &str) -> Table {
        let mut t = Table::new();
        t.insert("threading".into(), self.threading.name().into());
        if let Some(c) = (self.counters)(self, host) {
            t.insert("counters".into(), s(&c));
        }
        if self.threading == Threading::Shared {
            let mut shared = Table::new();
            shared.insert("idle".into(), self.idle.clone().into());
            if self.pinned {
                shared.insert("core".into(), 2.into());
            }
            t.insert("shared".into(), Value::Table(shared));
        }
        t
    }

    /// A role table's placement keys, under dedicated threading only.
    fn place(&self, t: &mut Table, core_key: &str, cores: Value) {
        if self.threading != Threading::Dedicated {
            return;
        }
        t.insert("idle".into(), self.idle.clone().into());
        if self.pinned {
            t.insert(core_key.into(), cores);
        }
    }

    /// The datagram address of member `node` (1 or 2) of the group of `stream`.
    fn datagram_address(&self, node: usize, stream: u32) -> String {
        format!(
            "{}:{}",
            self.seq_ip[node - 1],
            self.port_base + port(stream)
        )
    }

    /// The replication address of member `node` (1 or 2) of the group of `stream`.
    fn replication_address(&self, node: usize, stream: u32) -> String {
        format!(
            "{}:{}",
            self.seq_ip[node - 1],
            self.port_base + 10 + port(stream)
        )
    }

    /// Sequencer host `node`'s file (1: `seq`, 2: `seq2`): its member of every stream's
    /// sequencer group.
    pub(crate) fn seq_member(&self, node: usize) -> Table {
        let host = SEQ_HOSTS[node - 1];
        let mut file = self.header(host);
        let mut groups = Vec::new();
        for (i, stream) in self.sequenced().into_iter().enumerate() {
            let name = stream_name(stream);
            let mut t = Table::new();
            t.insert("name".into(), format!("{name}-seq").into());
            t.insert("store".into(), s(&self.store(host, stream)));
            t.insert("stream_id".into(), i64::from(stream).into());
            t.insert("listen".into(), self.datagram_address(node, stream).into());
            t.insert(
                "source".into(),
                strings(
                    Self::sources(stream)
                        .into_iter()
                        .map(|(id, h)| format!("{id}@{}", self.host_ip[h])),
                ),
            );
            t.insert(
                "source_key".into(),
                self.source_keys(Self::sources(stream).into_iter().map(|(id, _)| id)),
            );
            // A group member takes no shorter segments (each duty cycle's datagrams must fit
            // with at most one roll).
            let segment_size = self.segment_size.max(MIN_FENCED_SEGMENT_SIZE);
            t.insert("segment_size".into(), (segment_size as i64).into());
            match self.heartbeat_ms {
                Some(ms) => t.insert("heartbeat_ms".into(), (ms as i64).into()),
                None => t.insert("no_heartbeat".into(), true.into()),
            };
            t.insert("node_id".into(), (node as i64).into());
            t.insert(
                "member".into(),
                strings((1..=2).map(|n| format!("{n}={}", self.replication_address(n, stream)))),
            );
            t.insert("etcd".into(), strings(self.etcd.iter().cloned()));
            t.insert("etcd_prefix".into(), format!("/seqstream/{name}").into());
            t.insert("lease_ttl_s".into(), (self.lease_ttl_s as i64).into());
            t.insert("release".into(), "standby-ack".into());
            t.insert("bootstrap".into(), (node == 1).into());
            t.insert("secret_file".into(), s(&self.secret));
            t.insert("allow".into(), self.consumers(stream));
            self.place(&mut t, "core", (2 + i as i64).into());
            groups.push(Value::Table(t));
        }
        file.insert("sequencer_group".into(), Value::Array(groups));
        file
    }

    /// The `allow` list of `stream`'s replication server(s): the addresses of the hosts
    /// that keep a replica of it.
    fn consumers(&self, stream: u32) -> Value {
        let mut allow: Vec<String> = self
            .replicated_to(stream)
            .iter()
            .map(|&h| self.client_ip[h].to_string())
            .collect();
        allow.dedup();
        strings(allow)
    }

    /// Application host `host`'s file (0: host 1, 1: host 2).
    pub(crate) fn app_host(&self, host: usize) -> Table {
        let me = ["h1", "h2"][host];
        let mut file = self.header(me);
        let mut next_core = 2i64;
        let mut core = || {
            next_core += 1;
            next_core
        };
        let mut follows = Vec::new();
        for stream in self.replicas(host) {
            let mut t = Table::new();
            t.insert("name".into(), format!("{}-rep", stream_name(stream)).into());
            t.insert("store".into(), s(&self.store(me, stream)));
            t.insert("stream_id".into(), i64::from(stream).into());
            t.insert("secret_file".into(), s(&self.secret));
            let upstream = if stream == COMPOSITE {
                Value::String(format!(
                    "{}:{}",
                    self.host_ip[1],
                    self.port_base + 10 + port(COMPOSITE)
                ))
            } else {
                strings((1..=2).map(|n| self.replication_address(n, stream)))
            };
            t.insert("upstream".into(), upstream);
            self.place(&mut t, "core", core().into());
            follows.push(Value::Table(t));
        }
        let mut f = Table::new();
        f.insert("name".into(), "fwd".into());
        f.insert(
            "outbox".into(),
            strings(
                self.outboxes_of(host)
                    .into_iter()
                    .map(|(file, _, _)| self.outbox(me, file).display().to_string()),
            ),
        );
        let mut routes: Vec<u32> = self
            .outboxes_of(host)
            .into_iter()
            .map(|(_, _, st)| st)
            .collect();
        routes.sort();
        routes.dedup();
        f.insert(
            "route".into(),
            strings(routes.into_iter().map(|st| {
                // `NODE_ID@ADDR`: the forwarder follows the leader a term-start frame names.
                let members: Vec<String> = (1..=2)
                    .map(|n| format!("{n}@{}", self.datagram_address(n, st)))
                    .collect();
                format!(
                    "{st}={}={}",
                    members.join(","),
                    self.store(me, st).display()
                )
            })),
        );
        f.insert("bind".into(), format!("{}:0", self.host_ip[host]).into());
        // A forwarder moves to the group's next member once the oldest message it sent has
        // waited this long unconfirmed with nothing confirmed meanwhile (500 ms by default),
        // or to the new leader as soon as its local copy shows its term-start frame,
        // whichever comes first.
        f.insert("resend_timeout_ms".into(), RESEND_TIMEOUT_MS.into());
        f.insert(
            "source_key".into(),
            self.source_keys(self.outboxes_of(host).into_iter().map(|(_, id, _)| id)),
        );
        self.place(&mut f, "core", 2.into());
        file.insert("follow".into(), Value::Array(follows));
        file.insert("forward".into(), Value::Array(vec![Value::Table(f)]));
        if host == 1 {
            self.composite_roles(&mut file, &mut core);
        }
        file
    }

    /// Host 2's compositor (merging its replicas of the sequenced streams) and the
    /// composite's replication server.
    fn composite_roles(&self, file: &mut Table, core: &mut impl FnMut() -> i64) {
        let mut c = Table::new();
        c.insert("name".into(), "composite".into());
        c.insert(
            "component".into(),
            strings(
                self.sequenced()
                    .into_iter()
                    .map(|st| self.store("h2", st).display().to_string()),
            ),
        );
        c.insert("output".into(), s(&self.store("h2", COMPOSITE)));
        c.insert("stream_id".into(), i64::from(COMPOSITE).into());
        c.insert("policy".into(), "arrival".into());
        c.insert("segment_size".into(), (self.segment_size as i64).into());
        self.place(&mut c, "core", core().into());
        file.insert("compositor".into(), Value::Array(vec![Value::Table(c)]));
        let mut t = Table::new();
        t.insert("name".into(), "composite-serve".into());
        t.insert("store".into(), s(&self.store("h2", COMPOSITE)));
        t.insert("stream_id".into(), i64::from(COMPOSITE).into());
        t.insert("secret_file".into(), s(&self.secret));
        t.insert(
            "listen".into(),
            format!(
                "{}:{}",
                self.host_ip[1],
                self.port_base + 10 + port(COMPOSITE)
            )
            .into(),
        );
        t.insert("allow".into(), self.consumers(COMPOSITE));
        let cores: Vec<Value> = self
            .replicated_to(COMPOSITE)
            .iter()
            .map(|_| Value::from(core()))
            .collect();
        self.place(&mut t, "cores", Value::Array(cores));
        file.insert("serve".into(), Value::Array(vec![Value::Table(t)]));
    }

    /// Every host's file as TOML text: (`seq`/`seq2`/`h1`/`h2`, text).
    pub(crate) fn files(&self) -> Vec<(&'static str, String)> {
        let text = |t: Table| toml::to_string(&t).expect("a host file serializes");
        vec![
            ("seq", text(self.seq_member(1))),
            ("seq2", text(self.seq_member(2))),
            ("h1", text(self.app_host(0))),
            ("h2", text(self.app_host(1))),
        ]
    }
}

/// Every forwarder's resend timeout, ms: how long its oldest unconfirmed message waits
/// before everything unconfirmed goes to the group's next member, when the leader has died
/// and no term-start frame has named the new one yet.
const RESEND_TIMEOUT_MS: i64 = 100;

/// The sequencer hosts: member 1 and member 2 of every sequencer group.
pub(crate) const SEQ_HOSTS: [&str; 2] = ["seq", "seq2"];

/// Writes the topology's files for four real hosts into `dir` (`seq-host/`, `seq-host-2/`,
/// `host1/`, `host2/`, each a `seqstreamd.toml`): the example files of `config/`.
pub(crate) fn write_real_hosts(dir: &std::path::Path, cme: bool, itch: bool) -> anyhow::Result<()> {
    let ip = |d: u8| IpAddr::from([10, 0, 0, d]);
    let site = Site {
        cme,
        itch,
        seq_ip: [ip(1), ip(4)],
        host_ip: [ip(2), ip(3)],
        client_ip: [ip(2), ip(3)],
        etcd: ["10.0.0.5", "10.0.0.6", "10.0.0.7"]
            .iter()
            .map(|h| format!("http://{h}:2379"))
            .collect(),
        lease_ttl_s: 2,
        stores: |_, _| PathBuf::from("/var/lib/seqstream"),
        outboxes: |_, _| PathBuf::from("/dev/shm/seqstream"),
        counters: |_, _| Some(PathBuf::from("/dev/shm/seqstream/seqstreamd.counters")),
        secret: PathBuf::from("/etc/seqstream/secret"),
        keys: PathBuf::from("/etc/seqstream/keys"),
        work: PathBuf::new(),
        port_base: 7000,
        segment_size: 1 << 30,
        heartbeat_ms: Some(100),
        threading: Threading::Dedicated,
        idle: "busy-spin".into(),
        pinned: true,
    };
    for ((_, text), host) in
        site.files()
            .into_iter()
            .zip(["seq-host", "seq-host-2", "host1", "host2"])
    {
        let d = dir.join(host);
        std::fs::create_dir_all(&d)?;
        let header = format!(
            "# {host}: one seqstreamd runs every role of this host (see config/README.md and\n# docs/seqstreamd.md). Written by `demo --write-config config`: the demo runs this\n# topology, so edit the topology (apps/src/bin/demo/topology.rs), not this file.\n\n"
        );
        std::fs::write(d.join("seqstreamd.toml"), header + &text)?;
    }
    Ok(())
}
