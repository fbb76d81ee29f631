"""Shipping a trained model: ONNX export and its torch-free runtime, the HTTP server, the Hub repository."""
