"""Registration from an unknown initial pose (``register(..., init='global')``): candidate poses
from features and PWAN's own starts (:mod:`hypotheses`), chosen by PWAN's partial objective and
refused when the data cannot vouch for the winner (:mod:`choose`), the whole search
(:mod:`search`)."""
