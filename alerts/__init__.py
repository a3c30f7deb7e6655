"""CTR alerts that know statistics: rules over the merged view (:mod:`alerts.rules`), stored in
the lake (:mod:`alerts.store`), tested against their baseline (:mod:`alerts.statistics`) by the
evaluator (:mod:`alerts.evaluate`), which tells an analyst when a campaign's CTR, volume or
orphan clicks really moved, and never for noise."""
