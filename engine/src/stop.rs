//! Stop strings matched on the streamed text. The matched string is not emitted unless asked
//! for (`include`), and while the end of the text could still be the start of a stop string,
//! those characters are held back (released if the next text rules the match out).

#[derive(Debug)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    /// Emit the matched stop string as the text's end.
    include: bool,
    pending: String,
}

/// Text that may be emitted now, and the stop string that ended the text, if one did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Matched {
    pub emit: String,
    pub stop: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>, include: bool) -> Self {
        Self {
            stops,
            include,
            pending: String::new(),
        }
    }

    /// Adds streamed text.
    pub fn push(&mut self, text: &str) -> Matched {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return Matched {
                emit: std::mem::take(&mut self.pending),
                stop: None,
            };
        }
        // The earliest match wins (then the longest at that place).
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
        if let Some((at, s)) = hit {
            let stop = Some(s.clone());
            self.pending
                .truncate(if self.include { at + s.len() } else { at });
            return Matched {
                emit: std::mem::take(&mut self.pending),
                stop,
            };
        }
        let hold = self.partial_suffix();
        let emit = self.pending[..self.pending.len() - hold].to_string();
        self.pending.drain(..self.pending.len() - hold);
        Matched { emit, stop: None }
    }

    /// Text held back when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest end of `pending` that begins some stop string.
    fn partial_suffix(&self) -> usize {
        let p = &self.pending;
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        (1..longest.min(p.len() + 1))
            .rev()
            .find(|&k| {
                p.is_char_boundary(p.len() - k)
                    && self.stops.iter().any(|s| s.starts_with(&p[p.len() - k..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect(), false);
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.emit);
            if r.stop.is_some() {
                return (out, r.stop);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn a_stop_split_over_pieces_is_cut_and_never_emitted() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".to_string(), Some("END".to_string()))
        );
    }

    #[test]
    fn a_partial_match_is_held_then_released() {
        let mut m = StopMatcher::new(vec!["STOP".into()], false);
        assert_eq!(m.push("go ST").emit, "go ");
        assert_eq!(m.push("AY").emit, "STAY");
        assert_eq!(run(&["STOP"], &["x ST"]), ("x ST".to_string(), None));
    }

    #[test]
    fn earliest_match_wins_and_multibyte_is_safe() {
        assert_eq!(
            run(&["b", "ab"], &["xab"]),
            ("x".to_string(), Some("ab".to_string()))
        );
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".to_string(), None));
        assert_eq!(
            run(&["é!"], &["café", "!"]),
            ("caf".to_string(), Some("é!".to_string()))
        );
    }

    #[test]
    fn an_included_stop_ends_the_text_and_nothing_after_it_is_emitted() {
        let mut m = StopMatcher::new(vec!["END".into(), "ab".into()], true);
        assert_eq!(m.push("x E").emit, "x ");
        let r = m.push("ND tail");
        assert_eq!((r.emit.as_str(), r.stop.as_deref()), ("END", Some("END")));
    }

    #[test]
    fn no_stops_passes_everything() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), None));
    }
}
