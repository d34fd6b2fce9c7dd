//! Caffe-style parameter blobs (not yet implemented).
