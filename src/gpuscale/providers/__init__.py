"""Cloud providers behind one narrow protocol (:mod:`gpuscale.providers.base`)."""
