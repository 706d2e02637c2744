//! minik8s serverless: the Function and Workflow custom resources, controller and gateway (not built yet).
