"""How many steps a batch needs: the bundled digits, steps to a target accuracy, the noise
scale, steps(B) fits (the time-to-accuracy study and the accuracy app)."""
