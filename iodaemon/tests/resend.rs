//! When the forwarder resends, and where to: a steady flow of new messages to a sequencer that
//! is gone does not hold back the resend of the oldest (it goes to the group's next member in
//! the first cycle that begins a resend timeout after it was sent), a pause past the timeout
//! with the confirmation unread resends nothing (nor with a backlog ahead of it in the copy),
//! a cycle that began before the timeout does not resend, and a term-start frame in the
//! local copy sends the datagrams, and everything unconfirmed, to the leader it names at
//! once. A local copy that does not exist yet is looked for every `MISSING_CHECK_EVERY_NS`,
//! not in every cycle. Times on a manual clock.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use seqstream_agent::clock::ManualClock;
use seqstream_agent::counters::{self, CountersWriter};
use seqstream_agent::{Agent, DutyCycle};
use seqstream_iodaemon::forwarder::{Forwarder, ForwarderConfig, Route, MISSING_CHECK_EVERY_NS};
use seqstream_iodaemon::outbox::Outbox;
use seqstream_schemas::wire;
use seqstream_store::{Appender, FrameFields, StoreConfig};

const STREAM: u32 = 6;
const SOURCE: u32 = 1;
const MS: u64 = 1_000_000;

/// A group member that only counts what reaches it.
struct Member(UdpSocket);

impl Member {
    fn new() -> Member {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Member(s)
    }

    fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }

    /// The source seqs of the messages waiting here (the caller has just run a cycle, and
    /// loopback delivers at once: a short read timeout then ends the drain).
    fn received(&self) -> Vec<u64> {
        let mut buf = [0u8; 2048];
        let mut seqs = Vec::new();
        self.0
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        while let Ok(n) = self.0.recv(&mut buf) {
            let d = wire::DatagramHeaderDecoder::decode(&buf[..n]).unwrap();
            let first = d.first_source_seq();
            let count = d.messages().unwrap().count() as u64;
            seqs.extend(first..first + count);
        }
        seqs
    }
}

/// One outbox's stream routed to `members` (named by `node_ids`), confirmed in `store`; a
/// 100 ms resend timeout.
fn config(outbox: &Path, members: &[&Member], node_ids: Vec<u32>, store: &Path) -> ForwarderConfig {
    let route = Route {
        stream_id: STREAM,
        sequencers: members.iter().map(|m| m.addr()).collect(),
        node_ids,
        local_store: store.to_path_buf(),
    };
    ForwarderConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        resend_timeout: Duration::from_millis(100),
        ..ForwarderConfig::new(vec![outbox.to_path_buf()], vec![route])
    }
}

struct Site {
    _dir: tempfile::TempDir,
    outbox: Outbox,
    forwarder: Forwarder,
    clock: ManualClock,
    counters: PathBuf,
    store: PathBuf,
}

impl Site {
    fn new(members: &[&Member], node_ids: Vec<u32>) -> Site {
        let d = tempfile::tempdir().unwrap();
        let outbox_path = d.path().join("app.outbox");
        let outbox = Outbox::open_or_create(&outbox_path, SOURCE, STREAM, 1 << 16, 64).unwrap();
        let clock = ManualClock::new(1_000 * MS, 0);
        let counters = d.path().join("io.counters");
        let w = CountersWriter::create(&counters, 64).unwrap();
        let store = d.path().join("copy");
        let forwarder = Forwarder::open_with_clock(
            config(&outbox_path, members, node_ids, &store),
            &w,
            clock.clock(),
        )
        .unwrap();
        Site {
            _dir: d,
            outbox,
            forwarder,
            clock,
            counters,
            store,
        }
    }

    fn offer(&mut self) {
        self.outbox.offer(STREAM, 0, b"order").unwrap();
        self.forwarder.do_work().unwrap();
    }

    fn counter(&self, label: &str) -> u64 {
        counters::read(&self.counters)
            .unwrap()
            .get(label)
            .unwrap_or(0)
    }
}

#[test]
fn new_messages_every_half_timeout_do_not_hold_back_the_resend_to_the_next_member() {
    let (dead, alive) = (Member::new(), Member::new());
    let mut site = Site::new(&[&dead, &alive], Vec::new());
    site.offer();
    assert_eq!(dead.received(), vec![1]);
    // A new message every 50 ms; the first has waited 100 ms at the third.
    site.clock.advance(50 * MS);
    site.offer();
    assert_eq!(dead.received(), vec![2]);
    assert_eq!(alive.received(), Vec::<u64>::new());
    site.clock.advance(50 * MS);
    site.offer();
    assert_eq!(
        dead.received(),
        vec![3],
        "the new message goes out before the timeout is looked at"
    );
    assert_eq!(
        alive.received(),
        vec![1, 2, 3],
        "one resend timeout after the first message, everything unconfirmed goes to the next member"
    );
    assert_eq!(site.counter("sequencer switches"), 1);
    assert_eq!(site.counter("messages resent"), 3);
    site.clock.advance(50 * MS);
    site.offer();
    assert_eq!(alive.received(), vec![4]);
    assert_eq!(dead.received(), Vec::<u64>::new());
}

/// A site whose one message went to `member`, then a pause of ten resend timeouts, then the
/// early half of the cycle after it; the local copy's appender (the replication client's
/// writes) and that cycle.
fn paused_after_one_message(member: &Member) -> (Site, Appender, DutyCycle) {
    let mut site = Site::new(&[member], Vec::new());
    let copy = appender(&site.store);
    site.offer();
    assert_eq!(member.received(), vec![1]);
    let cycle = DutyCycle { now_ns: 0 };
    site.clock.advance(1_000 * MS);
    Agent::do_work(&mut site.forwarder, &cycle).unwrap();
    (site, copy, cycle)
}

/// A thread that runs the forwarder and the replication client (a shared or invoked duty
/// cycle: the forwarder's `do_work`, the client's, then the forwarder's `do_late_work`)
/// pauses past the resend timeout, with the confirmation of what it sent waiting in the
/// client's socket: the cycle after the pause does not resend it. A message that is not
/// confirmed is resent in that same cycle.
#[test]
fn a_pause_past_the_timeout_with_the_confirmation_unread_resends_nothing() {
    let member = Member::new();
    let (mut site, mut copy, cycle) = paused_after_one_message(&member);
    sequence(&mut copy, 1..=1);
    site.forwarder.do_late_work(&cycle).unwrap();
    assert_eq!(member.received(), Vec::<u64>::new());
    assert_eq!(site.counter("messages resent"), 0);
    assert_eq!(site.counter("messages confirmed"), 1);
    // The same pause with nothing confirmed: the message goes again in the cycle's late half.
    site.offer();
    assert_eq!(member.received(), vec![2]);
    site.clock.advance(1_000 * MS);
    Agent::do_work(&mut site.forwarder, &cycle).unwrap();
    assert_eq!(member.received(), Vec::<u64>::new());
    site.forwarder.do_late_work(&cycle).unwrap();
    assert_eq!(member.received(), vec![2]);
    assert_eq!(site.counter("messages resent"), 1);
}

/// The timeout is judged as of the moment the cycle began: a cycle that began before it
/// passed does not resend, however long the cycle took; the next one does.
#[test]
fn a_cycle_that_began_before_the_timeout_does_not_resend() {
    let member = Member::new();
    let mut site = Site::new(&[&member], Vec::new());
    site.offer();
    assert_eq!(member.received(), vec![1]);
    let cycle = DutyCycle { now_ns: 0 };
    site.clock.advance(99 * MS);
    Agent::do_work(&mut site.forwarder, &cycle).unwrap();
    site.clock.advance(2 * MS);
    site.forwarder.do_late_work(&cycle).unwrap();
    assert_eq!(member.received(), Vec::<u64>::new());
    site.forwarder.do_work().unwrap();
    assert_eq!(member.received(), vec![1]);
}

/// A pause leaves a backlog in the local copy longer than one read (4096 frames) ahead of
/// the confirmation: the route is judged only once its copy was read to the end, so the
/// delivered message is not resent.
#[test]
fn a_backlog_in_the_copy_holds_back_the_timeout_until_it_is_read() {
    let member = Member::new();
    let (mut site, mut copy, cycle) = paused_after_one_message(&member);
    let other = FrameFields {
        source_id: SOURCE + 1,
        ..FrameFields::default()
    };
    for s in 1..=5_000 {
        let fields = FrameFields {
            source_seq: s,
            ..other
        };
        copy.append_with(&fields, b"order").unwrap();
    }
    sequence(&mut copy, 1..=1);
    site.forwarder.do_late_work(&cycle).unwrap();
    assert_eq!(
        member.received(),
        Vec::<u64>::new(),
        "not judged mid-backlog"
    );
    assert_eq!(site.counter("messages confirmed"), 0);
    site.forwarder.do_work().unwrap();
    assert_eq!(site.counter("messages confirmed"), 1);
    assert_eq!(site.counter("messages resent"), 0);
    assert_eq!(member.received(), Vec::<u64>::new());
}

/// The route's local copy is missing when the first cycle looks for it and appears right
/// after, holding the confirmation: cycles within `MISSING_CHECK_EVERY_NS` of that look do
/// not look again, and the first cycle after it confirms the message.
#[test]
fn a_missing_local_copy_is_looked_for_every_so_often_not_every_cycle() {
    let member = Member::new();
    let mut site = Site::new(&[&member], Vec::new());
    site.offer();
    assert_eq!(member.received(), vec![1]);
    let mut copy = appender(&site.store);
    sequence(&mut copy, 1..=1);
    for cycle in 0..10 {
        site.forwarder.do_work().unwrap();
        assert_eq!(
            site.counter("messages confirmed"),
            0,
            "looked for again at cycle {cycle}"
        );
    }
    site.clock.advance(MISSING_CHECK_EVERY_NS - 1);
    site.forwarder.do_work().unwrap();
    assert_eq!(
        site.counter("messages confirmed"),
        0,
        "looked for too early"
    );
    site.clock.advance(1);
    site.forwarder.do_work().unwrap();
    assert_eq!(site.counter("messages confirmed"), 1);
    assert_eq!(site.counter("messages resent"), 0);
}

/// Appends what a sequencer would: `SOURCE`'s messages `seqs`.
fn sequence(a: &mut Appender, seqs: std::ops::RangeInclusive<u64>) {
    for s in seqs {
        let fields = FrameFields {
            source_id: SOURCE,
            source_seq: s,
            ..FrameFields::default()
        };
        a.append_with(&fields, b"order").unwrap();
    }
}

fn appender(store: &Path) -> Appender {
    Appender::open_or_create(store, StoreConfig::new(STREAM).segment_size(1 << 20)).unwrap()
}

#[test]
fn a_term_start_frame_sends_everything_unconfirmed_to_the_leader_it_names_at_once() {
    let (one, two) = (Member::new(), Member::new());
    let mut site = Site::new(&[&one, &two], vec![1, 2]);
    let mut copy = appender(&site.store);
    copy.start_term(1, 1).unwrap();
    for _ in 0..3 {
        site.offer();
    }
    assert_eq!(one.received(), vec![1, 2, 3]);
    sequence(&mut copy, 1..=1);
    // Member 2 takes over (member 1 sequenced 2 and died before it reached the copy).
    copy.start_term(2, 2).unwrap();
    site.forwarder.do_work().unwrap();
    assert_eq!(
        two.received(),
        vec![2, 3],
        "resent to the new leader without waiting for the timeout"
    );
    assert_eq!(site.counter("sequencer switches"), 1);
    site.offer();
    assert_eq!(two.received(), vec![4]);
    assert_eq!(one.received(), Vec::<u64>::new());

    // A term-start frame of a node the route does not name changes nothing: no switch, and
    // no resend to a member that may be gone (the timeout moves on from it).
    copy.start_term(3, 7).unwrap();
    site.forwarder.do_work().unwrap();
    assert_eq!(two.received(), Vec::<u64>::new());
    assert_eq!(site.counter("sequencer switches"), 1);
    assert_eq!(site.counter("messages resent"), 2);
    sequence(&mut copy, 2..=4);
    site.forwarder.do_work().unwrap();
    assert_eq!(site.counter("messages confirmed"), 4);
    assert_eq!(site.counter("in flight"), 0);
}

#[test]
fn a_forwarder_started_over_a_history_of_terms_switches_once_to_the_latest_leader() {
    let (one, two) = (Member::new(), Member::new());
    let mut site = Site::new(&[&one, &two], vec![1, 2]);
    // The local copy the forwarder finds at its first cycle: four terms, led in turn.
    let mut copy = appender(&site.store);
    for (term, node) in [(1, 1), (2, 2), (3, 1), (4, 2)] {
        copy.start_term(term, node).unwrap();
    }
    site.offer();
    assert_eq!(
        site.counter("sequencer switches"),
        1,
        "one switch, to term 4's leader"
    );
    assert_eq!(two.received(), vec![1], "sent to node 2");
    assert_eq!(one.received(), Vec::<u64>::new());
    assert_eq!(site.counter("messages resent"), 0);
}

#[test]
fn routes_with_node_ids_that_do_not_match_their_sequencers_are_refused() {
    let (one, two) = (Member::new(), Member::new());
    for ids in [vec![1], vec![3, 3]] {
        let d = tempfile::tempdir().unwrap();
        let outbox = d.path().join("app.outbox");
        Outbox::open_or_create(&outbox, SOURCE, STREAM, 1 << 16, 64).unwrap();
        let w = CountersWriter::create(&d.path().join("io.counters"), 64).unwrap();
        let e = Forwarder::open(
            config(&outbox, &[&one, &two], ids.clone(), &d.path().join("copy")),
            &w,
        )
        .err()
        .unwrap_or_else(|| panic!("node ids {ids:?} accepted"));
        assert!(e.to_string().contains("node ids"), "{e}");
    }
}
