//! The response parser both connection flavours share, free of I/O.
//!
//! [`AnswerDecoder::decode`] is fed whatever bytes have arrived so far and says how
//! many of them it used; it keeps its place between calls, so an answer may
//! arrive split at any byte (the proptest below splits it everywhere). The
//! head (status line and headers) goes through [`httparse`], the chunk-size
//! lines and trailers of a chunked body too; the framing rules are ours:
//!
//! - 1xx answers are interim: skipped, or handed back one by one when the
//!   caller asks for them ([`AnswerDecoder::interim`]).
//! - 204 and 304 have no body, whatever their headers say.
//! - `Transfer-Encoding: chunked` wins over `Content-Length` (RFC 9112 §6.3).
//! - Two different `Content-Length`s, a bad length or chunk size, a body over
//!   [`MAX_BODY`]: an error, never a panic and never a guess.
//! - Without either, the body runs until the peer closes
//!   ([`AnswerDecoder::finish_at_eof`]) and the connection cannot be reused.
//! - `Connection: close` (or HTTP/1.0 without `keep-alive`) marks the
//!   connection as not reusable once the answer is read.
//!
//! The bytes after a finished answer are left untouched: they are the next
//! (pipelined) answer's.

use std::fmt;

/// Largest body the parser accepts.
pub const MAX_BODY: usize = 64 << 20;

/// Largest head (status line and headers, or a chunked body's trailers).
pub const MAX_HEAD: usize = 64 << 10;

/// Most headers an answer may carry.
const MAX_HEADERS: usize = 64;

/// Why an answer could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

impl From<ParseError> for std::io::Error {
    fn from(e: ParseError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

fn bad(msg: impl Into<String>) -> ParseError {
    ParseError(msg.into())
}

/// The head of a parsed answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerHead {
    /// The status code.
    pub status: u16,
    /// The reason phrase (kept only with [`AnswerDecoder::keep_headers`]).
    pub reason: String,
    /// The headers in order, names lowercased, values trimmed (kept only
    /// with [`AnswerDecoder::keep_headers`]).
    pub headers: Vec<(String, String)>,
    /// Whether the connection may carry another request after this answer.
    pub keep_alive: bool,
}

impl AnswerHead {
    /// The first value of header `name` (case-insensitive; needs
    /// [`AnswerDecoder::keep_headers`]).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// How the body being read is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the whole head.
    Head,
    /// `n` more bytes of a Content-Length body.
    Length(usize),
    /// Waiting for a chunk-size line.
    ChunkSize,
    /// `n` more bytes of a chunk's data.
    ChunkData(usize),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// The trailers after the last chunk, up to an empty line.
    Trailers,
    /// Everything until the peer closes.
    UntilClose,
}

/// What one [`AnswerDecoder::decode`] call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the input used (drop them from the buffer).
    pub used: usize,
    /// Whether an answer is complete: its head is [`AnswerDecoder::head`], its
    /// body what was appended to the body buffer.
    pub done: bool,
}

/// A resumable parser of one answer at a time.
#[derive(Debug, Clone)]
pub struct AnswerDecoder {
    state: State,
    head: AnswerHead,
    keep_headers: bool,
    interim: bool,
    body_len: usize,
}

impl Default for AnswerDecoder {
    fn default() -> Self {
        AnswerDecoder::new()
    }
}

impl AnswerDecoder {
    /// A parser that keeps no reason phrase or header (no allocation per
    /// answer) and skips 1xx answers.
    pub fn new() -> Self {
        AnswerDecoder {
            state: State::Head,
            head: AnswerHead::default(),
            keep_headers: false,
            interim: false,
            body_len: 0,
        }
    }

    /// Keeps the reason phrase and the headers of every answer in [`AnswerHead`].
    pub fn keep_headers(mut self, keep: bool) -> Self {
        self.keep_headers = keep;
        self
    }

    /// Hands back 1xx answers as answers of their own instead of skipping them.
    pub fn interim(mut self, hand_back: bool) -> Self {
        self.interim = hand_back;
        self
    }

    /// The head of the answer being read (complete once its head is parsed).
    pub fn head(&self) -> &AnswerHead {
        &self.head
    }

    /// Whether an answer is under way (some of its bytes were used).
    pub fn in_progress(&self) -> bool {
        self.state != State::Head
    }

    /// Starts over: the next byte is the first of a new answer.
    pub fn reset(&mut self) {
        self.state = State::Head;
        self.body_len = 0;
    }

    /// Parses what it can of `input`, appending body bytes to `body`.
    pub fn decode(&mut self, input: &[u8], body: &mut Vec<u8>) -> Result<Step, ParseError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                State::Head => {
                    let Some(n) = self.parse_head(rest)? else {
                        return Ok(Step { used, done: false });
                    };
                    used += n;
                    body.clear();
                    self.body_len = 0;
                    if (100..200).contains(&self.head.status) && !self.interim {
                        continue; // an interim answer: the real one follows
                    }
                    if self.state == State::Head {
                        // An answer without a body (or a 1xx handed back).
                        return Ok(Step { used, done: true });
                    }
                }
                State::Length(0) => {
                    self.state = State::Head;
                    return Ok(Step { used, done: true });
                }
                State::Length(n) | State::ChunkData(n) => {
                    let take = n.min(rest.len());
                    if take == 0 {
                        return Ok(Step { used, done: false });
                    }
                    body.extend_from_slice(&rest[..take]);
                    used += take;
                    self.state = match self.state {
                        State::Length(_) => State::Length(n - take),
                        _ if n == take => State::ChunkEnd,
                        _ => State::ChunkData(n - take),
                    };
                }
                State::ChunkSize => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((n, size))) => {
                        let size = usize::try_from(size).map_err(|_| bad("chunk size out of range"))?;
                        self.grow(size)?;
                        used += n;
                        self.state = if size == 0 { State::Trailers } else { State::ChunkData(size) };
                    }
                    Ok(httparse::Status::Partial) => {
                        if rest.len() > 1024 {
                            return Err(bad("chunk-size line too long"));
                        }
                        return Ok(Step { used, done: false });
                    }
                    Err(_) => return Err(bad("bad chunk size")),
                },
                State::ChunkEnd => {
                    if rest.len() < 2 {
                        if rest.first().is_some_and(|&c| c != b'\r') {
                            return Err(bad("chunk data not followed by CRLF"));
                        }
                        return Ok(Step { used, done: false });
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(bad("chunk data not followed by CRLF"));
                    }
                    used += 2;
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    let mut trailers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    match httparse::parse_headers(rest, &mut trailers) {
                        Ok(httparse::Status::Complete((n, _))) => {
                            used += n;
                            self.state = State::Head;
                            return Ok(Step { used, done: true });
                        }
                        Ok(httparse::Status::Partial) if rest.len() <= MAX_HEAD => {
                            return Ok(Step { used, done: false });
                        }
                        Ok(httparse::Status::Partial) => return Err(bad("trailers too large")),
                        Err(e) => return Err(bad(format!("bad trailers: {e}"))),
                    }
                }
                State::UntilClose => {
                    self.grow(rest.len())?;
                    body.extend_from_slice(rest);
                    used += rest.len();
                    return Ok(Step { used, done: false });
                }
            }
        }
    }

    /// The peer closed the connection: true when that ends the answer (a
    /// body delimited by the close), false when the answer is cut off (or
    /// none had begun).
    pub fn finish_at_eof(&mut self) -> bool {
        if self.state == State::UntilClose {
            self.state = State::Head;
            true
        } else {
            false
        }
    }

    /// Counts `n` more body bytes against [`MAX_BODY`].
    fn grow(&mut self, n: usize) -> Result<(), ParseError> {
        self.body_len = self.body_len.saturating_add(n);
        if self.body_len > MAX_BODY {
            return Err(bad("answer body larger than 64 MiB"));
        }
        Ok(())
    }

    /// Parses a whole head out of `input` and sets the body's state;
    /// None while the head is incomplete.
    fn parse_head(&mut self, input: &[u8]) -> Result<Option<usize>, ParseError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut r = httparse::Response::new(&mut headers);
        let n = match r.parse(input) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if input.len() <= MAX_HEAD => return Ok(None),
            Ok(httparse::Status::Partial) => return Err(bad("answer head too large")),
            Err(e) => return Err(bad(format!("bad answer head: {e}"))),
        };
        let status = r.code.ok_or_else(|| bad("no status code"))?;
        let http10 = r.version == Some(0);
        let mut keep_alive = !http10;
        let mut length: Option<usize> = None;
        let mut chunked = false;
        self.head.headers.clear();
        self.head.reason.clear();
        if self.keep_headers {
            self.head.reason.push_str(r.reason.unwrap_or_default());
        }
        for h in r.headers.iter() {
            let value = h.value.trim_ascii();
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                    .and_then(|s| s.parse::<usize>().ok())
                    .ok_or_else(|| bad("bad content-length"))?;
                if length.is_some_and(|m| m != n) {
                    return Err(bad("two different content-lengths"));
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let last = value.rsplit(|&c| c == b',').next().unwrap_or_default().trim_ascii();
                chunked = last.eq_ignore_ascii_case(b"chunked");
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in value.split(|&c| c == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
                        keep_alive = true;
                    }
                }
            }
            if self.keep_headers {
                let v = String::from_utf8_lossy(value).into_owned();
                self.head.headers.push((h.name.to_ascii_lowercase(), v));
            }
        }
        self.head.status = status;
        self.head.keep_alive = keep_alive;
        self.state = if (100..200).contains(&status) || status == 204 || status == 304 {
            State::Head
        } else if chunked {
            State::ChunkSize
        } else if let Some(len) = length {
            self.grow(len)?;
            State::Length(len)
        } else {
            self.head.keep_alive = false;
            State::UntilClose
        };
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Decodes every answer of `input` fed in pieces cut at `cuts`.
    fn decode_all(
        d: &mut AnswerDecoder,
        input: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<(AnswerHead, Vec<u8>)>, ParseError> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut body = Vec::new();
        let mut fed = 0;
        let mut ends: Vec<usize> = cuts.iter().map(|&c| c.min(input.len())).collect();
        ends.push(input.len());
        ends.sort_unstable();
        for end in ends {
            buf.extend_from_slice(&input[fed..end]);
            fed = end;
            loop {
                let step = d.decode(&buf, &mut body)?;
                buf.drain(..step.used);
                if step.done {
                    out.push((d.head().clone(), std::mem::take(&mut body)));
                } else {
                    break;
                }
                if buf.is_empty() {
                    break;
                }
            }
        }
        if d.finish_at_eof() {
            out.push((d.head().clone(), std::mem::take(&mut body)));
        }
        Ok(out)
    }

    fn one(input: &[u8]) -> (AnswerHead, Vec<u8>) {
        let mut all = decode_all(&mut AnswerDecoder::new().keep_headers(true), input, &[]).unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        all.pop().unwrap()
    }

    const PIPELINE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-hf3fs-meta-epoch: 9\r\n\r\n{}\
HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n\
HTTP/1.1 100 Continue\r\n\r\n\
HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: t\r\n\r\n\
HTTP/1.1 304 Not Modified\r\n\r\n\
HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\ncontent-length: 4\r\n\r\nbusy";

    fn summary(all: &[(AnswerHead, Vec<u8>)]) -> Vec<(u16, String, bool)> {
        all.iter().map(|(h, b)| (h.status, String::from_utf8_lossy(b).into_owned(), h.keep_alive)).collect()
    }

    fn expected() -> Vec<(u16, String, bool)> {
        vec![
            (200, "{}".into(), true),
            (204, String::new(), true),
            (200, "abcde".into(), true),
            (304, String::new(), true),
            (503, "busy".into(), false),
        ]
    }

    #[test]
    fn pipelined_answers_of_every_framing() {
        let all = decode_all(&mut AnswerDecoder::new().keep_headers(true), PIPELINE, &[]).unwrap();
        assert_eq!(summary(&all), expected());
        assert_eq!(all[0].0.header("X-HF3FS-META-EPOCH"), Some("9"));
        assert_eq!(all[0].0.reason, "OK");
        assert_eq!(all[4].0.header("connection"), Some("close"));
    }

    #[test]
    fn interim_answers_are_handed_back_when_asked() {
        let all = decode_all(&mut AnswerDecoder::new().interim(true), PIPELINE, &[]).unwrap();
        let statuses: Vec<u16> = all.iter().map(|(h, _)| h.status).collect();
        assert_eq!(statuses, [200, 204, 100, 200, 304, 503]);
    }

    #[test]
    fn without_keep_headers_nothing_is_kept() {
        let all = decode_all(&mut AnswerDecoder::new(), PIPELINE, &[]).unwrap();
        assert!(all.iter().all(|(h, _)| h.headers.is_empty() && h.reason.is_empty()));
    }

    #[test]
    fn a_body_until_close_ends_at_eof_and_closes() {
        let (h, b) = one(b"HTTP/1.1 200 OK\r\n\r\nall of it");
        assert_eq!((h.status, b.as_slice(), h.keep_alive), (200, &b"all of it"[..], false));
        let (h, _) = one(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert!(!h.keep_alive, "HTTP/1.0 closes by default");
        let (h, _) = one(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n");
        assert!(h.keep_alive);
        let (h, _) = one(b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\ncontent-length: 0\r\n\r\n");
        assert!(!h.keep_alive);
    }

    #[test]
    fn chunked_wins_over_content_length() {
        let (_, b) = one(
            b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\ntransfer-encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        );
        assert_eq!(b, b"x");
    }

    #[test]
    fn a_cut_answer_is_not_finished_at_eof() {
        for cut in [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}".as_slice(), b"HTTP/1.1 200", b""] {
            let mut d = AnswerDecoder::new();
            let mut body = Vec::new();
            let step = d.decode(cut, &mut body).unwrap();
            assert!(!step.done);
            assert!(!d.finish_at_eof());
        }
    }

    #[test]
    fn malformed_answers_are_errors() {
        let cases: &[&[u8]] = &[
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTX/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 999999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxy",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        ];
        for c in cases {
            let r = decode_all(&mut AnswerDecoder::new(), c, &[]);
            assert!(r.is_err(), "{:?} gave {r:?}", String::from_utf8_lossy(c));
        }
        let huge = [b"HTTP/1.1 200 OK\r\nx: ".as_slice(), &vec![b'a'; MAX_HEAD + 1]].concat();
        assert!(decode_all(&mut AnswerDecoder::new(), &huge, &[]).is_err());
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_answers(cuts in proptest::collection::vec(0..PIPELINE.len(), 0..12)) {
            let all = decode_all(&mut AnswerDecoder::new(), PIPELINE, &cuts).unwrap();
            prop_assert_eq!(summary(&all), expected());
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..300) {
            let _ = decode_all(&mut AnswerDecoder::new().keep_headers(true), &bytes, &[cut]);
            let mut framed = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            framed.extend_from_slice(&bytes);
            let _ = decode_all(&mut AnswerDecoder::new(), &framed, &[cut]);
        }
    }
}
