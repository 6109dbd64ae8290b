"""GPU machinery the kernel families share: where GPU code can run (``device``), warp data
exchange in its shuffle and shared-memory forms (``warp_exchange``) and launch helpers
(``launch``). The families' GPU kernels sit beside their CPU twins."""
