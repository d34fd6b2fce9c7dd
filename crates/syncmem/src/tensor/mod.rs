//! Caffe2-style tensors (not yet implemented).
