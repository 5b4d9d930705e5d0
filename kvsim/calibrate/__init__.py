"""Trust in the step-time model: `kvsim profile` (step times measured on a GPU), `kvsim calibrate`
(fit the roofline's coefficients) and `kvsim validate` (predictions against measured runs)."""
