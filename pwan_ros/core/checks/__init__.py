"""What a result is judged by, from the data alone (caller units): the self-check of a pose
(:mod:`verify`: overlap beyond chance, held in every direction, no rival pose), the step that
retakes a better rival it finds (:mod:`rival`), the mass a pose shows (:mod:`mass`) and the
sensors' free space a pose must not contradict (:mod:`free_space`)."""
