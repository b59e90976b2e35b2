"""Never calls torch.compile."""
print("nothing compiled here")
