//! The vendored CME capture through the feed handler's loading, arbitration and the algo's
//! rule.

use std::path::PathBuf;

use seqstream_apps::feed::{self, FeedError};
use seqstream_apps::strategy::Strategy;
use seqstream_feeds::capture::CaptureError;
use seqstream_feeds::mdp3::{Arbiter, Arbitration, ReadError};

fn capture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data/cme-mdp3/cme_mdp3_v6_channel340_incremental.pcapng")
}

fn read(path: PathBuf, max_frames: Option<usize>) -> Result<usize, FeedError> {
    feed::read_mdp3(&[path], max_frames).map(|(p, _)| p.len())
}

#[test]
fn capture_arbitrates_to_one_copy_of_each_packet_and_the_rule_sends_hundreds_of_orders() {
    let (packets, stats) = feed::read_mdp3(&[capture_path()], None).unwrap();
    assert_eq!(packets.len(), 10_000);
    assert_eq!((stats.frames, stats.not_udp), (10_000, 0));
    let all: usize = packets.iter().map(|p| p.messages().count()).sum();
    assert_eq!(all, 20_546);
    let mut arbiter = Arbiter::default();
    let mut strategy = Strategy::new(1);
    let (mut kept, mut orders) = (0, 0);
    for p in &packets {
        if arbiter.accept(p.msg_seq_num) == Arbitration::Duplicate {
            continue;
        }
        for m in p.messages() {
            kept += 1;
            orders += strategy.on_market_data(m).unwrap().len();
        }
    }
    assert_eq!((arbiter.duplicates, arbiter.missed), (5_000, 0));
    assert_eq!(kept, 10_273);
    assert_eq!(orders, 448, "the rule is deterministic on the capture");
}

#[test]
fn a_truncated_or_missing_capture_is_a_clear_error() {
    let bytes = std::fs::read(capture_path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.pcapng");
    std::fs::write(&cut, &bytes[..100_000]).unwrap();
    match read(cut.clone(), None) {
        Err(FeedError::Mdp3(ReadError::Capture(CaptureError::Truncated { frame, .. }))) => {
            assert!(frame > 100, "{frame}")
        }
        other => panic!("{other:?}"),
    }
    // Up to the cut, the frames are readable.
    assert_eq!(read(cut, Some(100)).unwrap(), 100);
    let missing = dir.path().join("missing.pcapng");
    let e = read(missing.clone(), None).unwrap_err();
    assert!(e.to_string().contains("missing.pcapng"), "{e}");
    std::fs::write(&missing, b"not a capture at all").unwrap();
    assert!(matches!(
        read(missing, None),
        Err(FeedError::Mdp3(ReadError::Capture(
            CaptureError::UnknownFormat { .. }
        )))
    ));
}
