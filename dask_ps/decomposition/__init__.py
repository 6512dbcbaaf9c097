"""Topic models trained on the parameter server.

:class:`LatentDirichletAllocation` fits LDA by collapsed Gibbs sampling with
the word-topic counts and topic totals in ``dask_ps`` tables (the seed
paper's application); its ``transform``/``score``/``perplexity``/``bound_``
are scikit-learn's (its E-step and variational bound, from
``components_``), and :func:`document_completion` is the held-out metric
by prediction, usable on any model's topics.

The estimators use only the public ``dask_ps`` API and the shared estimator
machinery (``dask_ps._estimators``).
"""

from dask_ps.decomposition._gibbs import LostAssignmentsError
from dask_ps.decomposition._lda import LatentDirichletAllocation
from dask_ps.decomposition._scoring import document_completion

__all__ = ["LatentDirichletAllocation", "LostAssignmentsError", "document_completion"]
