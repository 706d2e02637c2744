//! minik8s kubelet: the node agent that runs pods on containerd through the CRI (see issue "Node"; not built yet).
