//! minik8s proxy: turns Services and EndpointSlices into iptables rules, and serves cluster DNS (not built yet).
