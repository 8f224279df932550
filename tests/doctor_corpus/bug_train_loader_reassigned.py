"""A typo: the training loop iterates a variable that was set to the validation loader."""

# expect: trains_on_validation
import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    loaders = {"train": val_loader, "valid": val_loader}
    for _ in range(epochs):
        model.train()
        for x, y in loaders["train"]:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in loaders["valid"]:
                model(x.to(device))
