//! The HorizontalPodAutoscaler's decisions (issue 17), as pure functions with upstream's
//! algorithm: [`calc`] proposes replicas from pod metrics, [`behavior`] stabilizes the proposal
//! and applies `spec.behavior`'s rate limits. The controller that reads metrics and writes
//! `scale` is still to come.

pub mod behavior;
pub mod calc;
