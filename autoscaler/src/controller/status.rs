//! Conditions in the Kubernetes convention: one per type, `lastTransitionTime` changing only
//! when the status does, so `kubectl wait` and alerts see real transitions, not every
//! reconcile.

use crate::crd::Condition;

/// The conditions of one status, edited in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conditions(Vec<Condition>);

impl From<Vec<Condition>> for Conditions {
    fn from(v: Vec<Condition>) -> Self {
        Conditions(v)
    }
}

impl Conditions {
    /// Sets a condition; its transition time moves only if its status changed.
    pub fn set(&mut self, type_: &str, status: bool, reason: &str, message: String, now: &str) {
        let status = if status { "True" } else { "False" };
        match self.0.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now.to_string();
                }
                c.status = status.into();
                c.reason = reason.into();
                c.message = message;
            }
            None => self.0.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                last_transition_time: now.into(),
            }),
        }
    }

    pub fn get(&self, type_: &str) -> Option<&Condition> {
        self.0.iter().find(|c| c.type_ == type_)
    }

    pub fn into_vec(self) -> Vec<Condition> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_a_change_of_status() {
        let mut c = Conditions::default();
        c.set("Stockout", false, "InStock", String::new(), "t0");
        c.set("Stockout", false, "InStock", String::new(), "t1");
        assert_eq!(c.get("Stockout").unwrap().last_transition_time, "t0");
        c.set("Stockout", true, "PendingTooLong", "l4".into(), "t2");
        let s = c.get("Stockout").unwrap();
        assert_eq!(
            (s.status.as_str(), s.last_transition_time.as_str()),
            ("True", "t2")
        );
        assert_eq!(c.into_vec().len(), 1);
    }
}
