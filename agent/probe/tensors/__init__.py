"""Reading MindSpore tensors from the training thread: msProbe's statistics, waiting for
the device without spinning, and a tensor's values captured on request."""
