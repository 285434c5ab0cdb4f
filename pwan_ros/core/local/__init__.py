"""The fit of one registration from what the caller knows (an init, or identity): Alg. 1 from
one start or the multi-start tournament and the fine-tune (:mod:`fit`, :mod:`multistart`, its
starts :mod:`starts` / :mod:`votes` and scores :mod:`scoring`), a non-rigid registration from its
rigid pre-alignment (:mod:`deform`), the fine-tune alone from a pose (:mod:`from_pose`), and a
fit assembled as a result in caller units with its self-check (:mod:`assemble`)."""
