#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| minik8s_fuzz::cel(data));
