//! Elections against a real etcd (Debian's `etcd-server`, started per test on free loopback
//! ports): terms only grow, a leader cut off from etcd stops before another can start, etcd's
//! loss ends a leadership within its lease, a resignation hands over at once, a switchover
//! request nobody acts on times out on a live connection, only a member of the recorded
//! in-sync set campaigns, a barred member sees the next leader as its key is written, and a
//! follower sees the set change as etcd records it.

use std::time::{Duration, Instant};

use seqstream_election::{
    request_switchover, Election, ElectionConfig, Fence, LeaderRecord, NodeSet, Role,
};
use seqstream_testkit::etcd::Etcd;
use seqstream_testkit::proxy::TcpProxy;

const TTL: Duration = Duration::from_secs(1);

/// An eligible member.
fn member(endpoint: String, node_id: u32) -> Election {
    let e = Election::start(
        ElectionConfig::new(vec![endpoint], "/seqstream/test", node_id).lease_ttl(TTL),
    )
    .unwrap();
    e.set_eligible(true);
    e
}

/// Waits (at most 15 s) until `done`, failing with `what`.
fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn leads(f: &Fence) -> bool {
    f.term_if_leading().is_some()
}

/// The leader `e` records `nodes` as the in-sync set, as its owner would once they caught up.
fn record_in_sync(e: &Election, nodes: &[u32]) {
    let generation = e.publish_in_sync(NodeSet::of(nodes.iter().copied()));
    wait("etcd holds the in-sync set", || {
        e.fence().in_sync_published(generation)
    });
}

#[test]
fn a_lone_member_leads_and_every_new_leadership_raises_the_term() {
    let etcd = Etcd::start();
    for term in 1..=3 {
        let a = member(etcd.endpoint(), 1);
        let f = a.fence();
        wait("the member leads", || leads(&f));
        assert_eq!(f.term_if_leading(), Some(term));
        assert_eq!(f.leader(), Some(LeaderRecord { node_id: 1, term }));
        assert_eq!(f.role(), Role::Leader);
        drop(a); // resigns: its lease is revoked
        assert!(!leads(&f));
        assert_eq!(f.stats().resignations, 1);
    }
}

/// A switchover request nobody acts on waits out its whole timeout on one etcd connection
/// (a watch that sees nothing): it ends in a refusal that says so, not in a connection etcd
/// closed for pinging it too often.
#[test]
fn a_switchover_nobody_acts_on_times_out_on_a_live_connection() {
    let etcd = Etcd::start();
    let a = member(etcd.endpoint(), 1);
    wait("member 1 leads", || leads(&a.fence()));
    record_in_sync(&a, &[1, 2]);
    let cfg = ElectionConfig::new(vec![etcd.endpoint()], "/seqstream/test", 1).lease_ttl(TTL);
    let started = Instant::now();
    let err = request_switchover(&cfg, Some(2), Duration::from_secs(3)).unwrap_err();
    assert!(
        matches!(&err, seqstream_election::Error::Switchover(why) if why.contains("no new leader")),
        "{err}"
    );
    assert!(started.elapsed() >= Duration::from_secs(3));
}

#[test]
fn a_leader_cut_off_from_etcd_stops_leading_before_another_can_start() {
    let etcd = Etcd::start();
    let link = TcpProxy::start(etcd.addr());
    let a = member(link.url(), 1);
    let fa = a.fence();
    wait("node 1 leads", || leads(&fa));
    record_in_sync(&a, &[1, 2]);
    let b = member(etcd.endpoint(), 2);
    let fb = b.fence();
    wait("node 2 follows node 1", || {
        fb.role() == Role::Follower
            && fb.leader()
                == Some(LeaderRecord {
                    node_id: 1,
                    term: 1,
                })
    });

    link.cut();
    let mut a_last_deadline = fa.deadline().expect("node 1 leads");
    let mut samples = 0u64;
    wait("node 2 leads", || {
        // Never two leaders at one instant, as each sees itself.
        let (ta, tb) = (fa.term_if_leading(), fb.term_if_leading());
        assert!(
            ta.is_none() || tb.is_none(),
            "two leaders: {ta:?} and {tb:?}"
        );
        if let Some(d) = fa.deadline() {
            a_last_deadline = a_last_deadline.max(d);
        }
        samples += 1;
        tb.is_some()
    });
    assert!(samples > 10);
    assert_eq!(fb.term_if_leading(), Some(2));
    let won = fb.won_at().expect("node 2 leads");
    assert!(
        a_last_deadline <= won,
        "node 1's fence ran until {a_last_deadline:?}, after node 2 won at {won:?}"
    );
    assert!(!leads(&fa));
    let sa = fa.stats();
    assert_eq!(sa.lapses, 1, "{sa:?}");
    assert!(sa.keepalive_failures >= 1, "{sa:?}");

    // Back on the network, node 1 follows the new term.
    link.heal();
    wait("node 1 follows node 2", || {
        fa.role() == Role::Follower
            && fa.leader()
                == Some(LeaderRecord {
                    node_id: 2,
                    term: 2,
                })
    });
    assert!(!leads(&fa));
}

#[test]
fn losing_etcd_ends_a_leadership_within_its_lease() {
    let mut etcd = Etcd::start();
    let a = member(etcd.endpoint(), 1);
    let f = a.fence();
    wait("the member leads", || leads(&f));
    let killed = Instant::now();
    etcd.kill();
    let deadline = f.deadline().expect("still leading just after the kill");
    assert!(
        deadline <= killed + TTL,
        "a fence past the lease: {deadline:?} > {:?}",
        killed + TTL
    );
    wait("the leadership ends", || !leads(&f));
    assert!(Instant::now() >= deadline);
    wait("the lapse is counted", || f.stats().lapses == 1);
    let s = f.stats();
    assert!(s.keepalive_failures + s.etcd_errors >= 1, "{s:?}");
}

#[test]
fn a_resignation_hands_over_and_an_ineligible_member_never_campaigns() {
    let etcd = Etcd::start();
    let a = member(etcd.endpoint(), 1);
    let fa = a.fence();
    wait("node 1 leads", || leads(&fa));
    record_in_sync(&a, &[1, 2]);
    let b = member(etcd.endpoint(), 2);
    b.set_eligible(false);
    let fb = b.fence();
    wait("node 2 follows", || fb.role() == Role::Follower);

    a.resign();
    wait("node 1 stops leading", || !leads(&fa));
    // Neither campaigns: node 1 resigned, node 2 is not eligible. Three lease lengths pass
    // without a leader.
    let until = Instant::now() + 3 * TTL;
    while Instant::now() < until {
        assert!(!leads(&fa) && !leads(&fb));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fb.stats().campaigns, 0);

    b.set_eligible(true);
    wait("node 2 leads", || leads(&fb));
    assert_eq!(fb.term_if_leading(), Some(2));
    wait("node 1 follows node 2", || {
        fa.leader()
            == Some(LeaderRecord {
                node_id: 2,
                term: 2,
            })
    });
    assert_eq!(fa.stats().resignations, 1);
}

#[test]
fn only_a_member_of_the_in_sync_set_campaigns_and_only_the_leader_records_it() {
    let etcd = Etcd::start();
    let a = member(etcd.endpoint(), 1);
    let fa = a.fence();
    wait("node 1 leads", || leads(&fa));
    assert_eq!(fa.in_sync_at_win(), NodeSet::of([1]), "a new group's set");
    let b = member(etcd.endpoint(), 2);
    let fb = b.fence();
    wait("node 2 follows", || fb.role() == Role::Follower);
    assert_eq!(fb.in_sync(), Some(NodeSet::of([1])));

    // Node 1 resigns (and campaigns no more for now); node 2, eligible but not in the set,
    // is barred: three lease lengths pass without a leader.
    a.resign();
    wait("node 2 is barred", || fb.stats().barred > 0);
    let until = Instant::now() + 3 * TTL;
    while Instant::now() < until {
        assert!(!leads(&fa) && !leads(&fb));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fb.stats().campaigns, 0);

    // Node 1 leads term 2 and records node 2; node 2 then takes over term 3 when it resigns,
    // its campaign recording the set it read.
    a.set_eligible(true);
    wait("node 1 leads term 2", || fa.term_if_leading() == Some(2));
    record_in_sync(&a, &[1, 2]);
    a.resign();
    wait("node 2 leads term 3", || fb.term_if_leading() == Some(3));
    assert_eq!(fb.in_sync_at_win(), NodeSet::of([1, 2]));

    // A member that does not lead records nothing.
    let generation = a.publish_in_sync(NodeSet::of([1]));
    std::thread::sleep(3 * TTL / 2);
    assert!(!fa.in_sync_published(generation));
    wait("node 1 reads the set", || {
        fa.in_sync() == Some(NodeSet::of([1, 2]))
    });
    assert!(fa.stats().in_sync_writes >= 1, "{:?}", fa.stats());
}

/// A member barred from campaigning (not in the in-sync set) learns of the next leader as
/// etcd writes its key, not a pause later: its pause (`retry_every`) is a minute here.
#[test]
fn a_barred_member_learns_of_the_next_leader_as_its_key_is_written() {
    let etcd = Etcd::start();
    let a = member(etcd.endpoint(), 1);
    let fa = a.fence();
    wait("node 1 leads", || leads(&fa));
    let mut cfg = ElectionConfig::new(vec![etcd.endpoint()], "/seqstream/test", 2).lease_ttl(TTL);
    cfg.retry_every = Duration::from_secs(60);
    let b = Election::start(cfg).unwrap();
    b.set_eligible(true);
    let fb = b.fence();
    wait("node 2 follows", || fb.role() == Role::Follower);
    a.resign();
    wait("node 2 is barred", || fb.stats().barred > 0);
    std::thread::sleep(Duration::from_millis(100)); // well into its pause
    a.set_eligible(true);
    wait("node 1 leads term 2", || fa.term_if_leading() == Some(2));
    wait("node 2 sees node 1 lead term 2", || {
        fb.leader()
            == Some(LeaderRecord {
                node_id: 1,
                term: 2,
            })
    });
}

/// A follower learns a new in-sync set when etcd records it, not at its next read of the
/// group (every lease TTL, 30 s here): a standby that has just joined the set may depose a
/// dead leader at once (seqstreamd's group member reads the set from the fence).
#[test]
fn a_follower_sees_the_in_sync_set_change_as_it_is_recorded() {
    let etcd = Etcd::start();
    let long = |node| {
        let e = Election::start(
            ElectionConfig::new(vec![etcd.endpoint()], "/seqstream/test", node)
                .lease_ttl(Duration::from_secs(30)),
        )
        .unwrap();
        e.set_eligible(true);
        e
    };
    let a = long(1);
    let fa = a.fence();
    wait("node 1 leads", || leads(&fa));
    let b = long(2);
    let fb = b.fence();
    wait("node 2 follows", || fb.role() == Role::Follower);
    assert_eq!(fb.in_sync(), Some(NodeSet::of([1])));
    record_in_sync(&a, &[1, 2]);
    wait(
        "node 2 sees the set that names it (15 s, half its re-read period)",
        || fb.in_sync() == Some(NodeSet::of([1, 2])),
    );
    record_in_sync(&a, &[1]);
    wait("node 2 sees the set without it", || {
        fb.in_sync() == Some(NodeSet::of([1]))
    });
}

/// Deletes `key` from the etcd at `endpoint`, as an operator's `etcdctl del` would.
fn delete_by_hand(endpoint: &str, key: &str) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = etcd_client::Client::connect([endpoint], None)
                .await
                .unwrap();
            c.delete(key, None).await.unwrap();
        });
}

#[test]
fn a_leader_key_deleted_by_hand_never_makes_two_leaders() {
    let etcd = Etcd::start();
    let a = member(etcd.endpoint(), 1);
    let fa = a.fence();
    wait("node 1 leads", || leads(&fa));
    let b = member(etcd.endpoint(), 2);
    let fb = b.fence();
    wait("node 2 follows", || fb.role() == Role::Follower);

    // Node 1 finds its key gone at its next renewal and stops; either node may then win
    // term 2, never while the other leads.
    delete_by_hand(&etcd.endpoint(), "/seqstream/test/leader");
    wait("a leader of term 2", || {
        let (ta, tb) = (fa.term_if_leading(), fb.term_if_leading());
        assert!(
            ta.is_none() || tb.is_none(),
            "two leaders: {ta:?} and {tb:?}"
        );
        ta == Some(2) || tb == Some(2)
    });
    assert_eq!(fa.stats().lapses, 1);
}
