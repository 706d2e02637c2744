//! minik8s conformance: scenarios driven with the stock kubectl against a real cluster (filled by the apiserver issue).
