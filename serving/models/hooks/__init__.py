"""What happens around an answer: experiments and shadows, the prediction log and the feature log."""
