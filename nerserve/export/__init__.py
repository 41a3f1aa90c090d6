"""Export stage: a trained model_store entry → parity-checked ONNX / TorchScript graph sets."""
