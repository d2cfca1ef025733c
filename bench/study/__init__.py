"""The fair "Does it teach?" study's code behind its command line, bench/study_fair.py (a script run from bench/,
so this package is ``study``): ``layout`` (the study's names and files), ``answers`` (the students' answers),
``kept`` (the explanations the students read), ``teachers`` (the teachers' runs and files), ``stats`` (the
bootstrap and the correlations), ``summary`` (accuracy, differences, control, correlation, requirements) and
``report`` (the table and the plots)."""
