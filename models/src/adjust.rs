//! [`Adjust`]: what a request does to a row's logits before its token is chosen (OpenAI's
//! `logit_bias`, `frequency_penalty` and `presence_penalty`, and the repetition penalty), as
//! changes to single ids. The engine's sampler applies them to a whole row on the host; a
//! model that picks tokens on its device applies the same changes there first
//! ([`crate::candle`]'s picks), so the row never has to cross to the host for them.

use std::collections::HashMap;

/// One id's change: `value = rep(logit + bias) − minus`, where `rep(v)` is `v / repeat` for
/// `v > 0` and `v × repeat` otherwise (the repetition penalty as CTRL defines it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    pub id: u32,
    /// Added first (`logit_bias`); 0 for none.
    pub bias: f32,
    /// The repetition penalty for an id already in the prompt or the output; 1 for none.
    pub repeat: f32,
    /// Subtracted last (the frequency penalty times the id's count in the output, plus the
    /// presence penalty); 0 for none.
    pub minus: f32,
}

impl Entry {
    /// An entry that changes nothing.
    pub fn of(id: u32) -> Self {
        Self {
            id,
            bias: 0.0,
            repeat: 1.0,
            minus: 0.0,
        }
    }

    /// The id's logit after the change. An entry that leaves a part at its "none" value
    /// changes nothing through it (`x + 0`, `x / 1`, `x × 1`, `x − 0`; up to the sign of a
    /// zero), so entries that each set one part, applied one after another in the order
    /// bias, repeat, minus, make the one entry that sets all three ([`Adjust::merged`]).
    pub fn value(&self, logit: f32) -> f32 {
        let v = logit + self.bias;
        let v = if v > 0.0 {
            v / self.repeat
        } else {
            v * self.repeat
        };
        v - self.minus
    }
}

/// A row's changes, one entry per id, in id order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Adjust {
    entries: Vec<Entry>,
}

impl Adjust {
    /// One entry per id from `changes`, in id order: each part an id's changes set (away
    /// from its "none" value) is kept, a later one replacing an earlier one. For changes that
    /// each set one part, in the order bias, repeat, minus ([`Entry::value`]), that is what
    /// applying them one after another does.
    pub fn merged(changes: impl IntoIterator<Item = Entry>) -> Self {
        let mut by_id: HashMap<u32, Entry> = HashMap::new();
        for c in changes {
            let e = by_id.entry(c.id).or_insert_with(|| Entry::of(c.id));
            if c.bias != 0.0 {
                e.bias = c.bias;
            }
            if c.repeat != 1.0 {
                e.repeat = c.repeat;
            }
            if c.minus != 0.0 {
                e.minus = c.minus;
            }
        }
        let mut entries: Vec<Entry> = by_id.into_values().collect();
        entries.sort_unstable_by_key(|e| e.id);
        Self { entries }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Applies the changes to a whole row (ids past it are a caller's bug).
    pub fn apply(&self, row: &mut [f32]) {
        for e in &self.entries {
            let l = &mut row[e.id as usize];
            *l = e.value(*l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_changes_only_what_it_names() {
        let e = |id, bias, repeat, minus| Entry {
            id,
            bias,
            repeat,
            minus,
        };
        assert_eq!(Entry::of(0).value(1.25), 1.25);
        assert_eq!(Entry::of(0).value(-3.5), -3.5);
        assert_eq!(e(0, 2.0, 1.0, 0.0).value(1.0), 3.0);
        // The penalty pushes both signs towards less likely.
        assert_eq!(e(0, 0.0, 2.0, 0.0).value(3.0), 1.5);
        assert_eq!(e(0, 0.0, 2.0, 0.0).value(-3.0), -6.0);
        // Bias first, then the penalty on the biased value, then the subtraction.
        assert_eq!(e(0, -4.0, 2.0, 0.5).value(3.0), -2.5);
        let changes = [
            e(3, 1.0, 1.0, 0.0),
            e(1, 0.0, 1.0, 1.0),
            e(3, 5.0, 1.0, 0.0),
            e(3, 0.0, 2.0, 0.0),
            e(3, 0.0, 1.0, 0.5),
        ];
        let a = Adjust::merged(changes);
        assert_eq!(a.entries().iter().map(|e| e.id).collect::<Vec<_>>(), [1, 3]);
        let mut row = [0.5f32; 4];
        a.apply(&mut row);
        assert_eq!(row, [0.5, -0.5, 0.5, 2.25]);
        // The same changes one after another (a later bias replaces an earlier one).
        let mut one_by_one = [0.5f32; 4];
        for c in &changes[1..] {
            let v = &mut one_by_one[c.id as usize];
            *v = c.value(*v);
        }
        assert_eq!(one_by_one, row);
    }
}
