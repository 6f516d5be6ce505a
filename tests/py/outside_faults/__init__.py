"""A measure of `mla-bisect replay`'s diagnosis written outside its engines: an independent numpy MLA layer
(mla_numpy), tiny HF-style checkpoints (checkpoints), and faults modelled on bugs reported against serving stacks
(faults), each with the answer expected from the tool written beside it."""
