//! minik8s gpu: the GPU Job custom resource and its controller that submits to a batch scheduler (not built yet).
