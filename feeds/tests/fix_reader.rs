//! `feeds::fix`: framing, verification, typed values, groups, on hand-built messages.

use seqstream_feeds::fix::group::{GroupError, NO_PARTY_IDS};
use seqstream_feeds::fix::value::{
    parse_char, parse_decimal, parse_int, parse_qty, parse_uint, parse_utc_timestamp, FieldError,
    ValueError,
};
use seqstream_feeds::fix::{checksum, Field, FixError, Reader};

/// A correct message: `body` is the fields after BodyLength, `|` for SOH.
fn msg(begin: &str, body: &str) -> Vec<u8> {
    let body = body.replace('|', "\x01");
    let mut m = format!("8={begin}\x019={}\x01{body}", body.len()).into_bytes();
    let sum = checksum(&m);
    m.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
    m
}

/// Owned `(tag, value)` pairs of one message.
type Owned = Vec<(u32, Vec<u8>)>;

fn kinds(input: &[u8]) -> Vec<Result<Owned, FixError>> {
    Reader::new(input)
        .map(|r| {
            r.map(|m| m.fields().map(|f| (f.tag, f.value.to_vec())).collect())
                .map_err(|e| e.kind)
        })
        .collect()
}

#[test]
fn a_message_reads_as_its_fields_in_order() {
    let m = msg("FIX.4.2", "35=0|34=7|49=A|56=B|");
    let got = kinds(&m);
    let expected: Owned = vec![
        (8, b"FIX.4.2".to_vec()),
        (9, b"20".to_vec()),
        (35, b"0".to_vec()),
        (34, b"7".to_vec()),
        (49, b"A".to_vec()),
        (56, b"B".to_vec()),
        (
            10,
            format!("{:03}", checksum(&m[..m.len() - 7])).into_bytes(),
        ),
    ];
    assert_eq!(got, vec![Ok(expected)]);
    let read = Reader::new(&m).next().unwrap().unwrap();
    assert_eq!(read.msg_type(), b"0");
    assert_eq!(read.msg_seq_num(), Ok(7));
    assert_eq!(read.sender_comp_id(), Some(&b"A"[..]));
    assert_eq!(read.target_comp_id(), Some(&b"B"[..]));
    assert_eq!(read.begin_string(), b"FIX.4.2");
    assert_eq!(read.as_bytes(), &m[..]);
    assert_eq!(
        read.fields().nth(4),
        Some(Field {
            tag: 49,
            value: b"A"
        })
    );
}

#[test]
fn prefixes_crlf_blank_lines_and_several_messages_per_line() {
    let a = msg("FIX.4.4", "35=0|34=1|");
    let b = msg("FIX.4.4", "35=0|34=2|");
    let mut log = b"20170101-09:00:06 -> ".to_vec();
    log.extend_from_slice(&a);
    log.extend_from_slice(&b);
    log.extend_from_slice(b"\r\n\r\n  \njunk\n");
    log.extend_from_slice(&a);
    let mut r = Reader::new(&log);
    let seqs: Vec<_> = r
        .by_ref()
        .map(|x| {
            x.map(|m| m.msg_seq_num().unwrap())
                .map_err(|e| (e.line, e.kind))
        })
        .collect();
    assert_eq!(
        seqs,
        vec![Ok(1), Ok(2), Err((4, FixError::JunkLine)), Ok(1)]
    );
    let s = r.stats();
    assert_eq!((s.lines, s.blank_lines, s.messages), (5, 2, 3));
    assert_eq!(s.count(FixError::JunkLine), 1);
    assert_eq!(s.total_errors(), 1);
}

#[test]
fn every_refusal_is_typed_and_counted_and_reading_goes_on() {
    let good = msg("FIX.4.2", "35=0|34=1|");
    let mut bad_sum = good.clone();
    let n = bad_sum.len();
    bad_sum[n - 2] = if bad_sum[n - 2] == b'9' { b'8' } else { b'9' };
    let short = String::from_utf8(good.clone())
        .unwrap()
        .replace("9=10", "9=11");
    let cases: Vec<(Vec<u8>, FixError)> = vec![
        (
            b"8=FIX.4.2\x01xx=1\x01".to_vec(),
            FixError::MissingBodyLength,
        ),
        (
            b"8=FIX.4.2\x019=abc\x01".to_vec(),
            FixError::MissingBodyLength,
        ),
        (
            b"8=FIX.4.2\x019=5\x0134=1\x01".to_vec(),
            FixError::MissingMsgType,
        ),
        (
            b"8=FIX.4.2\x019=5\x0135=0\x01".to_vec(),
            FixError::MissingCheckSum,
        ),
        (
            b"8=FIX.4.2\x019=5\x0135=0\x01=1\x0110=000\x01".to_vec(),
            FixError::MalformedField { offset: 19 },
        ),
        (
            b"8=FIX.4.2\x019=5\x0135=0\x0158=\x0110=000\x01".to_vec(),
            FixError::MalformedField { offset: 19 },
        ),
        (
            b"8=FIX.4.2\x019=5\x0135=0\x0110=12\x01".to_vec(),
            FixError::MalformedCheckSum,
        ),
        (
            b"8=FIX.4.2\x019=5\x0135=0\x0110=123".to_vec(),
            FixError::MalformedCheckSum,
        ),
        (
            short.into_bytes(),
            FixError::BodyLengthMismatch {
                declared: 11,
                actual: 10,
            },
        ),
    ];
    for (input, want) in &cases {
        let mut log = input.clone();
        log.push(b'\n');
        log.extend_from_slice(&good);
        let mut r = Reader::new(&log);
        let first = r.next().unwrap().unwrap_err();
        assert_eq!(first.kind, *want, "{:?}", String::from_utf8_lossy(input));
        assert_eq!((first.line, first.offset), (1, 0));
        assert!(r.next().unwrap().is_ok(), "reading goes on after {want:?}");
        assert_eq!(r.stats().count(*want), 1);
    }
    let e = Reader::new(&bad_sum).next().unwrap().unwrap_err();
    assert!(matches!(e.kind, FixError::CheckSumMismatch { .. }));
    assert_eq!(e.unverified().map(|m| m.msg_type()), Some(&b"0"[..]));
}

#[test]
fn typed_values() {
    assert_eq!(parse_int(b"-0042"), Ok(-42));
    assert_eq!(parse_int(b"4x"), Err(ValueError::NotInt));
    assert_eq!(parse_int(b""), Err(ValueError::NotInt));
    assert_eq!(parse_uint(b"-1"), Err(ValueError::Negative));
    assert_eq!(parse_decimal(b"43.2", 9), Ok(43_200_000_000));
    assert_eq!(parse_decimal(b"-.5", 2), Ok(-50));
    assert_eq!(parse_decimal(b"1.2300", 2), Ok(123));
    assert_eq!(parse_decimal(b"1.234", 2), Err(ValueError::Inexact));
    assert_eq!(parse_decimal(b"1e5", 2), Err(ValueError::NotDecimal));
    assert_eq!(parse_decimal(b".", 2), Err(ValueError::NotDecimal));
    assert_eq!(parse_decimal(b"1", 19), Err(ValueError::UnsupportedScale));
    assert_eq!(parse_decimal(b"9223372037", 9), Err(ValueError::OutOfRange));
    assert_eq!(parse_qty(b"10000.00"), Ok(10_000));
    assert_eq!(parse_char(b"D"), Ok(b'D'));
    assert_eq!(parse_char(b"DD"), Err(ValueError::NotChar));
    // 2004-05-21 is day 12_559 after 1970-01-01.
    let day = 12_559u64 * 86_400;
    assert_eq!(
        parse_utc_timestamp(b"20040521-13:27:00"),
        Ok((day + 13 * 3600 + 27 * 60) * 1_000_000_000)
    );
    assert_eq!(
        parse_utc_timestamp(b"20040521-13:27:00.125"),
        Ok((day + 13 * 3600 + 27 * 60) * 1_000_000_000 + 125_000_000)
    );
    assert_eq!(parse_utc_timestamp(b"19700101-00:00:00.000000001"), Ok(1));
    assert_eq!(
        parse_utc_timestamp(b"20000229-00:00:00"),
        Ok(951_782_400_000_000_000)
    );
    for bad in [
        &b"20010229-00:00:00"[..],
        b"20040521-24:00:00",
        b"20040521-13:27:00.12",
        b"19691231-23:59:59",
        b"2004052113:27:00",
    ] {
        assert_eq!(parse_utc_timestamp(bad), Err(ValueError::NotTimestamp));
    }
    let m = msg("FIX.4.2", "35=D|38=1.5|");
    let m = Reader::new(&m).next().unwrap().unwrap();
    assert_eq!(m.qty(39), Err(FieldError::Missing(39)));
    assert_eq!(
        m.qty(38),
        Err(FieldError::Invalid {
            tag: 38,
            error: ValueError::Inexact
        })
    );
    assert_eq!(m.decimal(38, 1), Ok(15));
}

#[test]
fn groups_follow_the_dictionary_and_check_their_counts() {
    let m = msg(
        "FIX.4.4",
        "35=AE|453=2|448=A|447=D|452=1|802=2|523=X|803=2|523=Y|803=3|448=B|452=3|1=ACC|",
    );
    let m = Reader::new(&m).next().unwrap().unwrap();
    let parties: Vec<_> = m.group(453).unwrap().collect();
    assert_eq!(parties.len(), 2);
    assert_eq!(parties[0].get(448), Some(&b"A"[..]));
    assert_eq!(
        parties[0].get(523),
        None,
        "523 is nested, not at this level"
    );
    let subs: Vec<_> = parties[0]
        .group(802)
        .unwrap()
        .map(|e| e.get(523).unwrap())
        .collect();
    assert_eq!(subs, vec![&b"X"[..], b"Y"]);
    assert_eq!(parties[1].fields().count(), 2);
    assert_eq!(parties[1].group(802).unwrap_err(), GroupError::Missing(802));
    assert_eq!(m.group(9999).unwrap_err(), GroupError::Unknown(9999));
    assert_eq!(m.group(552).unwrap_err(), GroupError::Missing(552));
    assert_eq!(m.get(1), Some(&b"ACC"[..]), "the field after the group");

    let short = msg("FIX.4.4", "35=AE|453=3|448=A|448=B|1=X|");
    let short = Reader::new(&short).next().unwrap().unwrap();
    assert_eq!(
        short.group(453).unwrap_err(),
        GroupError::CountMismatch {
            count_tag: 453,
            declared: 3,
            found: 2
        }
    );
    let bad = msg("FIX.4.4", "35=AE|453=x|");
    let bad = Reader::new(&bad).next().unwrap().unwrap();
    assert_eq!(bad.group(453).unwrap_err(), GroupError::BadCount(453));
    assert_eq!(NO_PARTY_IDS.members[0], 448);
}
