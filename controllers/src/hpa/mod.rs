//! The HorizontalPodAutoscaler (issue 17), with upstream's algorithm: [`calc`] proposes
//! replicas from pod metrics, [`behavior`] stabilizes the proposal and applies
//! `spec.behavior`'s rate limits, [`history`] remembers recent recommendations (across
//! restarts), and [`controller`] reads metrics and `scale`, and writes status and `scale`.

pub mod behavior;
pub mod calc;
pub mod controller;
pub mod history;
