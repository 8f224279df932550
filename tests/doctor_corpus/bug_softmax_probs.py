"""The loss is given probabilities (`.softmax(-1)`), in a closure-built step."""
# expect: softmax_before_cross_entropy

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    def step(x, y):
        probs = model(x).softmax(-1)
        loss = loss_fn(probs, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            step(x.to(device), y.to(device))
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                model(x.to(device))
