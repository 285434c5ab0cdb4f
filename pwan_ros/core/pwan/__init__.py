"""The paper's maths (Sec. 3-4, appendix B), in the normalised frame: the potential network
(:mod:`potential`), the gradients of Alg. 1's objective written out (:mod:`gradients`), Alg. 1
itself with S starts in lock-step (:mod:`alg1`) and how it runs fast (:mod:`acceleration`), the
batched transforms (:mod:`transforms`), the coherence regulariser of the non-rigid field
(:mod:`coherence`), the KR estimate of a discrepancy (:mod:`discrepancy`) and the exact LP
references (:mod:`exact`, POT). Nothing here knows about the policy after a fit."""
