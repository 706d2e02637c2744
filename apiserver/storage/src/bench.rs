//! Storage benchmarks (filled below).
