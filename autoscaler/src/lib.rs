//! `sluice-autoscaler`: scaling policy, trace-replay simulator and Kubernetes controller.
//!
//! Empty for now: the autoscaler issues fill it.
