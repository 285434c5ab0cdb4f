"""The fine-tune family (eq. fine_tune, the paper's refinement after Alg. 1) under one name,
normalised frame unless noted: its objective and IRLS steps (:mod:`objective`), one run of it in
a registration (:mod:`stage`), the soft-correspondence stage of a non-rigid field (:mod:`soft`,
CPD's EM steps) and the plane-aware GICP polish of a rigid 3-D pose (:mod:`gicp`, caller
units)."""
