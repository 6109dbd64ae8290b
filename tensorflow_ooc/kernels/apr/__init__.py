"""CP-APR (Poisson CP) kernels: model values at the nonzeros and the damped Newton row terms, on
CPU (:mod:`.cpu`) and their GPU twin (:mod:`.gpu`)."""
