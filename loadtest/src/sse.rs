//! A hand-rolled Server-Sent Events parser, fed the body's bytes as they arrive. Written by hand
//! (not a crate) because the load tester must know exactly *when* each event completed: the
//! caller stamps the time of the frame that finished an event, and nothing here buffers longer
//! than the end of a line.

/// What one complete event carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// The `data:` payload (several `data:` lines joined by `\n`, as the SSE spec says),
    /// borrowed from the parser: no allocation per event.
    Data(&'a [u8]),
    /// `data: [DONE]`, OpenAI's end-of-stream marker.
    Done,
}

/// Incremental parser: push bytes, take complete events. Handles `\n` and `\r\n` line ends and
/// lines split across frames; ignores comments (`:`), `event:`, `id:` and `retry:` fields.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes`; calls `on_event` for every event the bytes complete, in order.
    pub fn push(&mut self, bytes: &[u8], mut on_event: impl FnMut(Event<'_>)) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(pos);
            rest = &tail[1..];
            if self.line.is_empty() {
                self.end_line(head, &mut on_event);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                self.end_line(&line, &mut on_event);
                line.clear();
                self.line = line;
            }
        }
        self.line.extend_from_slice(rest);
    }

    /// Called at the end of the body: an event not closed by a blank line still counts (some
    /// servers end the stream right after the last `data:` line).
    pub fn finish(&mut self, mut on_event: impl FnMut(Event<'_>)) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.end_line(&line, &mut on_event);
        }
        self.dispatch(&mut on_event);
    }

    fn end_line(&mut self, line: &[u8], on_event: &mut impl FnMut(Event<'_>)) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        // Other fields and `:` comments carry nothing the figures need.
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        if !self.has_data {
            return;
        }
        self.has_data = false;
        if self.data == b"[DONE]" {
            on_event(Event::Done);
        } else {
            on_event(Event::Data(&self.data));
        }
        self.data.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events as owned strings (`None` for `[DONE]`).
    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<Option<String>> {
        let mut p = Parser::new();
        let mut out = Vec::new();
        let mut take = |e: Event<'_>| {
            out.push(match e {
                Event::Data(d) => Some(String::from_utf8(d.to_vec()).unwrap()),
                Event::Done => None,
            })
        };
        for chunk in input.chunks(piece) {
            p.push(chunk, &mut take);
        }
        p.finish(&mut take);
        out
    }

    #[test]
    fn events_survive_any_split_and_crlf() {
        let input = b": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: {\"b\"\ndata: :2}\n\ndata: [DONE]\n\n";
        let want = vec![
            Some("{\"a\":1}".to_string()),
            Some("{\"b\"\n:2}".to_string()),
            None,
        ];
        for piece in 1..input.len() {
            assert_eq!(parse_in_pieces(input, piece), want, "piece size {piece}");
        }
    }

    #[test]
    fn unterminated_last_event_is_kept() {
        assert_eq!(parse_in_pieces(b"data:x", 3), vec![Some("x".to_string())]);
    }
}
