"""The study over seeds and its statistics: ``aggregate`` (``python -m rlt_mono.study aggregate``), held-out
accuracy statistics (``eval_stats``), teacher diversity (``diversity``) and the arithmetic of explanations
(``arithmetic``)."""
